package enginesim

import (
	"encoding/json"
	"net/http"
	"strings"
	"sync"
)

// journal keeps the last requests the engine received, for tests that must
// see what a proxy really sent (GET /sim/requests).
type journal struct {
	mu    sync.Mutex
	limit int
	items []journalEntry
}

// journalEntry is one received request.
type journalEntry struct {
	Method  string              `json:"method"`
	Path    string              `json:"path"`
	Target  string              `json:"target"` // as on the request line
	Query   string              `json:"query,omitempty"`
	Headers map[string][]string `json:"headers"`
	Body    json.RawMessage     `json:"body,omitempty"`
	RawBody string              `json:"raw_body,omitempty"`
}

func newJournal(limit int) *journal { return &journal{limit: limit} }

func (j *journal) add(r *http.Request, body []byte) {
	e := journalEntry{Method: r.Method, Path: r.URL.Path, Target: r.RequestURI, Query: r.URL.RawQuery, Headers: map[string][]string{}}
	for k, v := range r.Header {
		e.Headers[strings.ToLower(k)] = v
	}
	if len(body) > 0 {
		if json.Valid(body) {
			e.Body = json.RawMessage(body)
		} else {
			e.RawBody = string(body)
		}
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	j.items = append(j.items, e)
	if len(j.items) > j.limit {
		j.items = j.items[len(j.items)-j.limit:]
	}
}

func (j *journal) list() []journalEntry {
	j.mu.Lock()
	defer j.mu.Unlock()
	return append([]journalEntry{}, j.items...)
}

func (j *journal) clear() {
	j.mu.Lock()
	j.items = nil
	j.mu.Unlock()
}
