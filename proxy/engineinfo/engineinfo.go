// Package engineinfo learns which engine, and which version of it, serves
// behind the sidecar: vLLM answers GET /version ({"version":"0.11.0"}),
// SGLang GET /get_server_info (a "version" member among its settings). The
// wire of a P/D split changes with the engine's version (the repository's
// corpus of upstream shapes, wirecorpus), so the version is exported
// (pd_sidecar_engine_info), shown by the status view and logged when it
// changes. The answers are an upstream's: read with a bound, and only a
// short printable version string is kept.
package engineinfo

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/tidwall/gjson"
)

// Engines as labelled.
const (
	VLLM   = "vllm"
	SGLang = "sglang"
)

// maxVersionLen bounds the version kept (a metric label value).
const maxVersionLen = 64

// Info is the local engine's kind and version.
type Info struct {
	Engine  string `json:"engine"`
	Version string `json:"version"`
}

// Probe is one path asked and the engine it names.
type Probe struct {
	Path   string
	Engine string
}

// Probes are the paths asked, in order; the first that answers a version wins.
func Probes() []Probe { return []Probe{{"/version", VLLM}, {"/get_server_info", SGLang}} }

// Parse reads an answer of probe: the version, or false when the answer
// names none (not 200, not a JSON object, no short printable version).
func Parse(probe Probe, status int, body []byte) (Info, bool) {
	if status != 200 || !gjson.ValidBytes(body) {
		return Info{}, false
	}
	v := gjson.GetBytes(body, "version")
	if v.Type != gjson.String || !plain(v.Str) {
		return Info{}, false
	}
	return Info{Engine: probe.Engine, Version: v.Str}, true
}

// plain reports whether s is 1..64 bytes of printable ASCII.
func plain(s string) bool {
	if len(s) == 0 || len(s) > maxVersionLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < ' ' || s[i] > '~' {
			return false
		}
	}
	return true
}

// GetFunc GETs path from the local engine: its status and body (read with
// a bound), or an error.
type GetFunc func(ctx context.Context, path string) (int, []byte, error)

// Watcher asks the local engine for its version at start, until it
// answers, and again every interval, and reports each change.
type Watcher struct {
	get      GetFunc
	interval time.Duration
	changed  func(old, now Info)
	cur      atomic.Pointer[Info]
}

// New returns a Watcher asking through get every interval (> 0); changed
// is called from its goroutine with the previous Info (zero at first) and
// the new one.
func New(get GetFunc, interval time.Duration, changed func(old, now Info)) *Watcher {
	return &Watcher{get: get, interval: interval, changed: changed}
}

// Current is the last Info the engine answered (zero until then).
func (w *Watcher) Current() Info {
	if p := w.cur.Load(); p != nil {
		return *p
	}
	return Info{}
}

// Run asks until ctx is done: every second until the engine first answers
// (it may still be loading), then every interval.
func (w *Watcher) Run(ctx context.Context) {
	for {
		wait := w.interval
		if !w.ask(ctx) && w.Current() == (Info{}) {
			wait = min(time.Second, w.interval)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// ask asks each probe in turn; it reports whether one answered.
func (w *Watcher) ask(ctx context.Context) bool {
	for _, p := range Probes() {
		st, body, err := w.get(ctx, p.Path)
		if err != nil {
			return false // the engine is not up: no other path will answer
		}
		info, ok := Parse(p, st, body)
		if !ok {
			continue
		}
		if old := w.Current(); old != info {
			w.cur.Store(&info)
			w.changed(old, info)
		}
		return true
	}
	return false
}
