package enginesim

import (
	"encoding/json"
	"net/http"
	"strings"
)

// journal keeps the last requests the engine received, for tests that must
// see what a proxy really sent (GET /sim/requests).
type journal struct{ *recent[journalEntry] }

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

func newJournal(limit int) *journal { return &journal{newRecent[journalEntry](limit)} }

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
	j.recent.add(e)
}
