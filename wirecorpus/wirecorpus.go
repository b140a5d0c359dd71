// Package wirecorpus is the repository's corpus of upstream wire shapes:
// each message an engine or a peer's proxy writes that the sidecar reads or
// hands on (a prefill answer's kv_transfer_params, a bootstrap server's
// answer, an encoder's ec_transfer_params, a leg's body), as that upstream
// writes it, with the source it was read from (repository, file, symbol,
// commit) and what the consuming side reads of it. The connectors' schemas
// and the engine simulator follow the corpus, and their tests run over it:
// a shape an engine writes that a connector refuses, or a member the
// decode side reads that a connector drops, fails a test.
//
// A shape is one file under upstream/, named by the shape. The corpus is
// embedded and read-only.
package wirecorpus

import (
	"embed"
	"encoding/json"
	"fmt"
	"path"
	"slices"
	"strings"
)

//go:embed upstream/*.json
var shapes embed.FS

// Messages a shape can be.
const (
	PrefillAnswer   = "prefill_answer"
	DecodeAnswer    = "decode_answer"
	BootstrapAnswer = "bootstrap_answer"
	EncoderAnswer   = "encoder_answer"
	PrefillRequest  = "prefill_request"
	DecodeRequest   = "decode_request"
	// ClientRequest is an inference request body as the engine reads it
	// from a client (every connector: Connector is AnyConnector); its
	// Decoder says how the engine's JSON reader reads it.
	ClientRequest = "client_request"
	// ErrorAnswer is an engine's error answer to a client request
	// (every connector: Connector is AnyConnector), with the HTTP status
	// it goes with (Status): what reaches the client, relayed as the
	// engine wrote it.
	ErrorAnswer = "error_answer"
)

// AnyConnector is the Connector of a shape every connector sees alike.
const AnyConnector = "any"

// Decoder is how an engine's JSON reader reads a request body where JSON
// leaves it to the reader: what the sidecar, which reads the first of a
// repeated name with names compared exactly, must refuse where the
// engine's reading would differ (connectors' one-parse rule).
type Decoder struct {
	// RepeatedName is which member of a name given twice is read:
	// "first" or "last".
	RepeatedName string `json:"repeated_name"`
	// NameCase is how names meet the engine's fields: "exact", or "fold"
	// (any letter case, Unicode simple folding).
	NameCase string `json:"name_case"`
	// LoneSurrogate is what becomes of a lone UTF-16 surrogate escape:
	// "kept", "replaced" (U+FFFD) or "refused".
	LoneSurrogate string `json:"lone_surrogate"`
	// Booleans is how a boolean member reads other JSON values: "strict"
	// (refused) or "lax" (some strings and numbers taken as booleans).
	Booleans string `json:"booleans"`
	// Source is where the reading was read.
	Source Source `json:"source"`
}

// Source is where a shape was read.
type Source struct {
	Repository string `json:"repository"`
	File       string `json:"file"`
	Symbol     string `json:"symbol"`
	// Commit is the 40-digit commit read; empty only where no stored
	// commit could be named, which the shape's notes explain.
	Commit  string `json:"commit"`
	PR      string `json:"pr"`
	Release string `json:"release"`
}

// Reads is what the consuming side of a shape reads of it.
type Reads struct {
	Source Source `json:"source"`
	// Members are the members of Value the consumer reads.
	Members []string `json:"members"`
	// Requires are those without which it ignores or refuses the message.
	Requires []string `json:"requires"`
}

// Shape is one upstream wire shape.
type Shape struct {
	// Name is the shape's name, its file's name without ".json".
	Name string `json:"name"`
	// Connector is the --kv-connector (or "ec-nixl") that reads it.
	Connector string `json:"connector"`
	// Engine is the upstream that writes it (vllm, vllm-ascend, sglang,
	// llm-d-inference-sim).
	Engine string `json:"engine"`
	// Message is what it is (PrefillAnswer, ...).
	Message string `json:"message"`
	// Container is the top-level member of the JSON body that holds
	// Value; empty when Value is the body's members themselves.
	Container string `json:"container"`
	// Generation labels the engine generation.
	Generation string `json:"generation"`
	Source     Source `json:"source"`
	// Value is the object as the upstream writes it, with example values.
	Value json.RawMessage `json:"value"`
	// DecodeReads is what the consuming side reads of Value.
	DecodeReads Reads `json:"decode_reads"`
	// Headers go with the message, where the upstream's proxy sends them.
	Headers map[string]string `json:"headers,omitempty"`
	// Decoder is how the consumer's JSON reader reads the message
	// (ClientRequest shapes).
	Decoder *Decoder `json:"decoder,omitempty"`
	// Status is the HTTP status the message goes with (ErrorAnswer
	// shapes; 0: none said).
	Status int    `json:"status,omitempty"`
	Notes  string `json:"notes"`
}

// Members returns the names of Value's top-level members, in its order.
func (s Shape) Members() []string {
	var names []string
	d := json.NewDecoder(strings.NewReader(string(s.Value)))
	if t, err := d.Token(); err != nil || t != json.Delim('{') {
		return nil
	}
	for d.More() {
		t, err := d.Token()
		if err != nil {
			return names
		}
		names = append(names, t.(string))
		var skip json.RawMessage
		if err := d.Decode(&skip); err != nil {
			return names
		}
	}
	return names
}

// Body returns the JSON body the shape stands in: Value under Container
// beside extra's members (a JSON object's members without braces, e.g.
// `"choices":[...]`), or Value's members with extra's when Container is
// empty.
func (s Shape) Body(extra string) []byte {
	if s.Container == "" {
		inner := strings.TrimSpace(string(s.Value))
		inner = strings.TrimSpace(inner[1 : len(inner)-1])
		switch {
		case extra == "":
			return []byte("{" + inner + "}")
		case inner == "":
			return []byte("{" + extra + "}")
		}
		return []byte("{" + extra + "," + inner + "}")
	}
	if extra == "" {
		return []byte(`{"` + s.Container + `":` + string(s.Value) + `}`)
	}
	return []byte("{" + extra + `,"` + s.Container + `":` + string(s.Value) + `}`)
}

// All returns every shape, sorted by name.
func All() ([]Shape, error) {
	entries, err := shapes.ReadDir("upstream")
	if err != nil {
		return nil, err
	}
	var out []Shape
	for _, e := range entries {
		b, err := shapes.ReadFile(path.Join("upstream", e.Name()))
		if err != nil {
			return nil, err
		}
		var s Shape
		if err := json.Unmarshal(b, &s); err != nil {
			return nil, fmt.Errorf("wirecorpus: %s: %w", e.Name(), err)
		}
		if s.Name+".json" != e.Name() {
			return nil, fmt.Errorf("wirecorpus: %s names the shape %q", e.Name(), s.Name)
		}
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b Shape) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// Get returns the shape named name.
func Get(name string) (Shape, error) {
	all, err := All()
	if err != nil {
		return Shape{}, err
	}
	for _, s := range all {
		if s.Name == name {
			return s, nil
		}
	}
	return Shape{}, fmt.Errorf("wirecorpus: no shape %q", name)
}

// Select returns the shapes of connector and message, sorted by name.
func Select(connector, message string) ([]Shape, error) {
	all, err := All()
	if err != nil {
		return nil, err
	}
	var out []Shape
	for _, s := range all {
		if s.Connector == connector && s.Message == message {
			out = append(out, s)
		}
	}
	return out, nil
}

// Generation names the shape of connector and message whose members are
// exactly members (in any order), or "" when no shape of the corpus has
// them: an answer of a generation the corpus does not know.
func Generation(connector, message string, members []string) string {
	shapes, err := Select(connector, message)
	if err != nil {
		return ""
	}
	want := slices.Sorted(slices.Values(members))
	for _, s := range shapes {
		if slices.Equal(slices.Sorted(slices.Values(s.Members())), want) {
			return s.Name
		}
	}
	return ""
}
