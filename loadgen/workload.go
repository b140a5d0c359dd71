// Package loadgen generates OpenAI-style load against one or more targets
// and measures what a client sees: time to first token, every inter-token
// gap, end-to-end latency, tokens and errors. cmd/pd-bench is its command
// line.
package loadgen

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"strconv"
	"strings"
)

// Dist is a distribution of integer lengths: a fixed value or a uniform
// range.
type Dist struct {
	Min, Max int
}

// ParseDist reads "N" (fixed) or "A-B" (uniform in [A, B]).
func ParseDist(s string) (Dist, error) {
	lo, hi, ranged := strings.Cut(s, "-")
	a, err := strconv.Atoi(strings.TrimSpace(lo))
	if err != nil || a < 1 {
		return Dist{}, fmt.Errorf("distribution %q: want N or A-B with positive integers", s)
	}
	if !ranged {
		return Dist{Min: a, Max: a}, nil
	}
	b, err := strconv.Atoi(strings.TrimSpace(hi))
	if err != nil || b < a {
		return Dist{}, fmt.Errorf("distribution %q: want A-B with A <= B", s)
	}
	return Dist{Min: a, Max: b}, nil
}

func (d Dist) String() string {
	if d.Min == d.Max {
		return strconv.Itoa(d.Min)
	}
	return fmt.Sprintf("%d-%d", d.Min, d.Max)
}

func (d Dist) draw(r *rand.Rand) int {
	if d.Max <= d.Min {
		return d.Min
	}
	return d.Min + r.IntN(d.Max-d.Min+1)
}

// API is the inference API a workload targets.
type API string

// The APIs pd-bench speaks.
const (
	APICompletions API = "completions"
	APIChat        API = "chat"
)

// Path returns the API's URL path.
func (a API) Path() string {
	if a == APIChat {
		return "/v1/chat/completions"
	}
	return "/v1/completions"
}

// Workload describes the requests to send.
type Workload struct {
	API    API
	Model  string
	Stream bool
	// PromptTokens and OutputTokens are the length distributions (in
	// words, which the engine simulator counts as one token each).
	PromptTokens, OutputTokens Dist
	// SharedPrefix is the fraction (0..1) of each prompt that is a prefix
	// shared by every request (a system prompt), so prefix caches can hit.
	SharedPrefix float64
	// Seed makes the prompts reproducible.
	Seed uint64
	// Distinct is the number of distinct requests generated (cycled).
	Distinct int
}

// Validate checks the workload.
func (w Workload) Validate() error {
	switch {
	case w.API != APICompletions && w.API != APIChat:
		return fmt.Errorf("api must be completions or chat, not %q", w.API)
	case w.Model == "":
		return errors.New("model must not be empty")
	case w.SharedPrefix < 0 || w.SharedPrefix > 1:
		return errors.New("shared prefix ratio must be within 0..1")
	case w.PromptTokens.Min < 1 || w.OutputTokens.Min < 1:
		return errors.New("lengths must be positive")
	}
	return nil
}

// Request is one prepared request body.
type Request struct {
	Body []byte
	// MaxTokens is the output cap the body sets (0 when unknown).
	MaxTokens int
}

// Generate builds the workload's distinct requests.
func (w Workload) Generate() []Request {
	r := rand.New(rand.NewPCG(w.Seed, w.Seed^0x5eed))
	n := max(w.Distinct, 1)
	shared := words(r, int(float64(w.PromptTokens.Max)*w.SharedPrefix))
	out := make([]Request, 0, n)
	for i := 0; i < n; i++ {
		plen := w.PromptTokens.draw(r)
		prefix := shared[:min(len(shared), int(float64(plen)*w.SharedPrefix))]
		prompt := strings.Join(append(append([]string{}, prefix...), words(r, plen-len(prefix))...), " ")
		maxTokens := w.OutputTokens.draw(r)
		body := map[string]any{"model": w.Model, "max_tokens": maxTokens, "stream": w.Stream}
		if w.API == APIChat {
			body["messages"] = []any{map[string]any{"role": "user", "content": prompt}}
		} else {
			body["prompt"] = prompt
		}
		if w.Stream {
			body["stream_options"] = map[string]any{"include_usage": true}
		}
		b, _ := json.Marshal(body)
		out = append(out, Request{Body: b, MaxTokens: maxTokens})
	}
	return out
}

var vocabulary = strings.Fields(`the a of and to in is was for on that with as by at from it an be this
which or are were not have has had but all their they one two new more other some time into than
cache block token prefill decode model server request stream kernel memory transfer network layer`)

func words(r *rand.Rand, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = vocabulary[r.IntN(len(vocabulary))] + strconv.Itoa(r.IntN(100))
	}
	return out
}

// ReadJSONL reads request bodies, one JSON object per line; model and
// stream are set from the workload, other fields are kept.
func ReadJSONL(rd io.Reader, w Workload) ([]Request, error) {
	var out []Request
	sc := bufio.NewScanner(rd)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for line := 1; sc.Scan(); line++ {
		text := strings.TrimSpace(sc.Text())
		if text == "" {
			continue
		}
		var body map[string]any
		if err := json.Unmarshal([]byte(text), &body); err != nil {
			return nil, fmt.Errorf("line %d: %w", line, err)
		}
		body["model"] = w.Model
		body["stream"] = w.Stream
		if w.Stream {
			body["stream_options"] = map[string]any{"include_usage": true}
		}
		maxTokens := 0
		if v, ok := body["max_tokens"].(float64); ok {
			maxTokens = int(v)
		}
		b, _ := json.Marshal(body)
		out = append(out, Request{Body: b, MaxTokens: maxTokens})
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, errors.New("no requests in file")
	}
	return out, nil
}
