package enginesim

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
)

// testSim is an in-process simulator on loopback ports.
type testSim struct {
	*Sim
	url string
}

// testLog writes a sim's log to its test until the test ends, and drops
// it after: a timer of the sim's (a KV lease expiring) may fire when the
// test is over, whenever the machine gets to it.
type testLog struct {
	mu   sync.Mutex
	w    io.Writer
	over bool
}

func (l *testLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.over {
		return len(p), nil
	}
	return l.w.Write(p)
}

func (l *testLog) end() {
	l.mu.Lock()
	l.over = true
	l.mu.Unlock()
}

func startSim(t *testing.T, role Role, mutate func(*Config)) *testSim {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Role = role
	cfg.Port, cfg.KVPort, cfg.BootstrapPort, cfg.P2PPort = 0, 0, 0, 0
	cfg.PrefillPerToken, cfg.DecodePerToken = 0, 0
	cfg.KVBandwidth = 0
	cfg.BootstrapTimeout = 5 * time.Second
	if mutate != nil {
		mutate(&cfg)
	}
	lw := &testLog{w: zerolog.NewTestWriter(t)}
	t.Cleanup(lw.end) // runs after the sim's own cleanup below
	s, err := New(cfg, zerolog.New(lw).Level(zerolog.WarnLevel))
	require.NoError(t, err)
	ls, err := s.Listen()
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = s.Serve(ctx, ls)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	ts := &testSim{Sim: s, url: "http://" + ls.HTTP.Addr().String()}
	require.Eventually(t, func() bool {
		return (s.KVAddr() != nil || ls.KV == nil) && (s.BootstrapAddr() != nil || ls.Bootstrap == nil) && s.P2PAddr() != nil
	}, 30*time.Second, time.Millisecond)
	return ts
}

// metric returns the value of a counter or gauge (sum over label sets), or
// the sample count of a histogram.
func (s *testSim) metric(t *testing.T, name string) float64 {
	t.Helper()
	return s.metricWhere(t, name, "", "")
}

// kindMetric is metric over the series labelled kind.
func (s *testSim) kindMetric(t *testing.T, name, kind string) float64 {
	t.Helper()
	return s.metricWhere(t, name, "kind", kind)
}

// metricWhere is metric over the series whose label has value (every series
// when label is "").
func (s *testSim) metricWhere(t *testing.T, name, label, value string) float64 {
	t.Helper()
	fams, err := s.reg.Gather()
	require.NoError(t, err)
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		var sum float64
		for _, m := range f.GetMetric() {
			if label != "" && !slices.ContainsFunc(m.GetLabel(), func(l *dto.LabelPair) bool { return l.GetName() == label && l.GetValue() == value }) {
				continue
			}
			switch {
			case m.Counter != nil:
				sum += m.GetCounter().GetValue()
			case m.Gauge != nil:
				sum += m.GetGauge().GetValue()
			case m.Histogram != nil:
				sum += float64(m.GetHistogram().GetSampleCount())
			}
		}
		return sum
	}
	return 0
}

type answer struct {
	status int
	body   []byte
	json   map[string]any
}

func post(t *testing.T, url, body string, header ...string) answer {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	a := answer{status: resp.StatusCode, body: b}
	_ = json.Unmarshal(b, &a.json)
	return a
}

// event is one parsed server-sent event.
type event struct {
	name string
	data string
}

func (e event) obj(t *testing.T) map[string]any {
	t.Helper()
	var m map[string]any
	require.NoError(t, json.Unmarshal([]byte(e.data), &m), "event data %q", e.data)
	return m
}

// stream posts body and reads every SSE event until the server closes. It
// also returns the read error (non-nil when the stream was cut).
func stream(t *testing.T, url, body string) (int, []event, error) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	require.NoError(t, err)
	defer resp.Body.Close()
	var evs []event
	sc := bufio.NewScanner(resp.Body)
	cur := event{}
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			cur.name = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			cur.data = strings.TrimPrefix(line, "data: ")
		case line == "":
			evs = append(evs, cur)
			cur = event{}
		}
	}
	return resp.StatusCode, evs, sc.Err()
}

// get walks a decoded JSON value by keys and indexes.
func get(v any, path ...any) any {
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, ok := v.(map[string]any)
			if !ok {
				return nil
			}
			v = m[k]
		case int:
			a, ok := v.([]any)
			if !ok || k >= len(a) {
				return nil
			}
			v = a[k]
		}
	}
	return v
}

func mustJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(b)
}

func longPrompt(words int) string {
	var b bytes.Buffer
	for i := 0; i < words; i++ {
		fmt.Fprintf(&b, "w%d ", i)
	}
	return b.String()
}

func httpGet(url string) ([]byte, error) {
	resp, err := http.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	return io.ReadAll(resp.Body)
}
