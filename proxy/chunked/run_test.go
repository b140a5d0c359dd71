package chunked_test

import (
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"

	"github.com/pd-sidecar/pd-sidecar/metrics"
	"github.com/pd-sidecar/pd-sidecar/proxy/chunked"
)

var (
	errBadRequest   = errors.New("bad request")
	errDecodeFailed = errors.New("decode engine failed")
	errClientGone   = errors.New("client gone")
	errKVLoadFailed = errors.New("kv load failed")
)

// fakeRequest is a chunked.Request whose engine answers each chunk with
// send, and which records what the decode did with the request.
type fakeRequest struct {
	send func(i int, body []byte) (chunked.Answer, error) // chunk i's answer (0 first)

	bodies   []string
	handoffs []bool
	gone     bool
	refuse   bool // Stream: the client has just left

	status      int
	contentType string
	body        []byte
	stream      io.ReadCloser
	watches     int
	left        bool
	finished    int
	pipelined   bool
	chunks      int
}

func (f *fakeRequest) Send(body []byte, handoff bool) (chunked.Answer, error) {
	f.bodies = append(f.bodies, string(body))
	f.handoffs = append(f.handoffs, handoff)
	return f.send(len(f.bodies)-1, body)
}

func (f *fakeRequest) Gone() bool { return f.gone }

func (f *fakeRequest) Answer(status int, contentType string, body []byte) {
	f.status, f.contentType, f.body = status, contentType, body
}

func (f *fakeRequest) Stream(status int, contentType string, body io.ReadCloser) bool {
	if f.refuse {
		return false
	}
	f.status, f.contentType, f.stream = 200, "text/event-stream", body
	return true
}

func (f *fakeRequest) Watch() func() bool {
	f.watches++
	return func() bool { return false }
}

func (f *fakeRequest) Left()                            { f.left = true }
func (f *fakeRequest) Finish(pipelined bool)            { f.finished++; f.pipelined = pipelined }
func (f *fakeRequest) Report(chunks int)                { f.chunks = chunks }
func (f *fakeRequest) Log(zerolog.Level) *zerolog.Event { return nil }
func (f *fakeRequest) answered(t *testing.T) gjson.Result {
	t.Helper()
	return gjson.ParseBytes(f.body)
}

var _ chunked.Request = (*fakeRequest)(nil)

// ok answers every chunk with the tokens it asks for, at most n, "length".
func ok(n int) func(int, []byte) (chunked.Answer, error) {
	return func(i int, body []byte) (chunked.Answer, error) {
		k := min(n, int(gjson.GetBytes(body, "max_tokens").Int()))
		return chunked.Answer{Status: 200, ContentType: "application/json", Body: chatAnswer(fmt.Sprintf(" t%d", i), "length", 5, k)}, nil
	}
}

// then answers chunk at with a, the others as base.
func then(base func(int, []byte) (chunked.Answer, error), at int, a chunked.Answer, err error) func(int, []byte) (chunked.Answer, error) {
	return func(i int, body []byte) (chunked.Answer, error) {
		if i == at {
			return a, err
		}
		return base(i, body)
	}
}

type rig struct {
	m        *metrics.Chunked
	inflight prometheus.Gauge
	deps     chunked.Deps
}

func newRig() *rig {
	m := metrics.NewChunked(prometheus.NewRegistry())
	return &rig{m: m, inflight: prometheus.NewGauge(prometheus.GaugeOpts{Name: "inflight"}), deps: chunked.Deps{
		Metrics: m, BadRequest: errBadRequest, DecodeFailed: errDecodeFailed, ClientGone: errClientGone, KVLoadFailed: errKVLoadFailed,
		ErrorBody: func(err error) []byte { return []byte(`{"error":{"message":` + quote(err.Error()) + `}}`) },
	}}
}

func (g *rig) run(t *testing.T, f *fakeRequest, body string, stream, remote bool) error {
	t.Helper()
	plan, ok := chunked.PlanFor([]byte(body), 4)
	require.True(t, ok)
	return chunked.Run(g.deps, f, chunked.Job{Plan: plan, Body: []byte(body), Stream: stream, Usage: true, Remote: remote, Inflight: g.inflight})
}

// outcomes are the decodes counted by outcome, the ones never seen left
// out.
func (g *rig) outcomes() map[string]float64 {
	out := map[string]float64{}
	for _, o := range []string{metrics.ChunkedCompleted, metrics.ChunkedFailed, metrics.ChunkedFallback, metrics.ChunkedClientLeft} {
		if v := testutil.ToFloat64(g.m.Decodes.WithLabelValues(o)); v > 0 {
			out[o] = v
		}
	}
	return out
}

const body10 = `{"messages":[{"role":"user","content":"hi"}],"max_tokens":10,"stream":true}`

// A JSON decode: chunks of 4, 4 and 2, one answer, counted once; only a
// split's first chunk carries the handoff.
func TestRunJSON(t *testing.T) {
	for _, remote := range []bool{false, true} {
		g := newRig()
		f := &fakeRequest{send: ok(4)}
		require.NoError(t, g.run(t, f, body10, false, remote))
		require.Len(t, f.bodies, 3)
		assert.Equal(t, []bool{remote, false, false}, f.handoffs)
		assert.EqualValues(t, 2, gjson.Get(f.bodies[2], "max_tokens").Int())
		assert.Equal(t, 200, f.status)
		assert.Equal(t, "application/json", f.contentType)
		assert.Equal(t, " t0 t1 t2", f.answered(t).Get("choices.0.message.content").String())
		assert.Equal(t, map[string]float64{metrics.ChunkedCompleted: 1}, g.outcomes())
		assert.Equal(t, 3.0, testutil.ToFloat64(g.m.Chunks))
		assert.Equal(t, 3, f.chunks, "the report's chunk count")
		assert.Zero(t, testutil.ToFloat64(g.inflight))
		assert.Zero(t, f.finished, "the request's to finish")
	}
}

// A streamed decode begins its stream once the first chunk is in, runs
// the others as the stream is read, each watched, and ends the request
// when the stream is closed.
func TestRunStream(t *testing.T) {
	g := newRig()
	f := &fakeRequest{send: ok(4)}
	require.NoError(t, g.run(t, f, body10, true, false))
	require.NotNil(t, f.stream)
	assert.Len(t, f.bodies, 1, "the rest as the stream is read")
	assert.Equal(t, 1.0, testutil.ToFloat64(g.inflight))
	b, err := io.ReadAll(f.stream)
	require.NoError(t, err)
	require.NoError(t, f.stream.Close())
	require.NoError(t, f.stream.Close(), "closed once")
	evs := events(t, b)
	require.Len(t, evs, 6, "%s", b) // role+t0, t1, t2, finish, usage, [DONE]
	assert.Equal(t, "assistant", evs[0]["choices"].([]any)[0].(map[string]any)["delta"].(map[string]any)["role"])
	assert.EqualValues(t, 10, evs[4]["usage"].(map[string]any)["completion_tokens"])
	assert.Nil(t, evs[5])
	assert.Equal(t, 2, f.watches, "each chunk after the first watched")
	assert.Equal(t, 1, f.finished)
	assert.False(t, f.left)
	assert.Equal(t, map[string]float64{metrics.ChunkedCompleted: 1}, g.outcomes())
	assert.Zero(t, testutil.ToFloat64(g.inflight))
}

// A streamed decode that ends with its first chunk is answered whole.
func TestRunStreamOneChunk(t *testing.T) {
	g := newRig()
	f := &fakeRequest{send: func(int, []byte) (chunked.Answer, error) {
		return chunked.Answer{Status: 200, Body: chatAnswer(" a", "stop", 5, 1)}, nil
	}}
	require.NoError(t, g.run(t, f, body10, true, false))
	assert.Nil(t, f.stream)
	assert.Equal(t, "text/event-stream", f.contentType)
	evs := events(t, f.body)
	require.Len(t, evs, 4) // role+text, finish, usage, [DONE]
	assert.Equal(t, map[string]float64{metrics.ChunkedCompleted: 1}, g.outcomes())
}

// A chunk failing before the answer began: an engine's error status is
// the client's answer (its error object, else the sidecar's); a KV load
// failure and a transport failure are the caller's, the client having
// seen nothing; so is a client that left.
func TestRunFailsBeforeAnswer(t *testing.T) {
	transport := errors.New("reset")
	tests := []struct {
		name    string
		stream  bool
		at      int
		answer  chunked.Answer
		err     error
		gone    bool
		refuse  bool
		want    error
		status  int
		body    string
		outcome string
	}{
		{name: "engine's error object", at: 1, answer: chunked.Answer{Status: 503, Body: []byte(`{"error":{"message":"busy"}}`)},
			status: 503, body: "busy", outcome: metrics.ChunkedFailed},
		{name: "engine's error text", at: 0, answer: chunked.Answer{Status: 500, Body: []byte(`oops`)},
			status: 500, body: "decode chunk answered 500", outcome: metrics.ChunkedFailed},
		{name: "KV load failure", at: 0, err: errKVLoadFailed, want: errKVLoadFailed, outcome: metrics.ChunkedFallback},
		{name: "transport failure", at: 2, err: transport, want: transport, outcome: metrics.ChunkedFailed},
		{name: "not a chat answer", at: 0, answer: chunked.Answer{Status: 200, Body: []byte(`{}`)}, want: errors.New(""), outcome: metrics.ChunkedFailed},
		{name: "client left", at: 0, err: fmt.Errorf("cancelled: %w", errClientGone), want: errClientGone, outcome: metrics.ChunkedClientLeft},
		{name: "client gone", at: 0, err: transport, gone: true, want: transport, outcome: metrics.ChunkedClientLeft},
		{name: "client left as the stream began", stream: true, at: -1, refuse: true, want: errClientGone, outcome: metrics.ChunkedClientLeft},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			g := newRig()
			f := &fakeRequest{send: then(ok(4), tc.at, tc.answer, tc.err), gone: tc.gone, refuse: tc.refuse}
			err := g.run(t, f, body10, tc.stream, true)
			switch {
			case tc.want == nil:
				require.NoError(t, err)
				assert.Equal(t, tc.status, f.status)
				assert.Equal(t, "application/json", f.contentType)
				assert.Contains(t, f.answered(t).Get("error.message").String(), tc.body)
			case tc.want.Error() == "":
				require.Error(t, err)
			default:
				require.ErrorIs(t, err, tc.want)
				assert.Zero(t, f.status, "nothing answered")
			}
			assert.Equal(t, map[string]float64{tc.outcome: 1}, g.outcomes())
			assert.Zero(t, testutil.ToFloat64(g.inflight))
			assert.Nil(t, f.stream)
		})
	}
}

// A chunk failing mid-stream ends the stream with an error event and
// [DONE]; a client that left fails the stream's read.
func TestRunFailsMidStream(t *testing.T) {
	t.Run("engine error", func(t *testing.T) {
		g := newRig()
		f := &fakeRequest{send: then(ok(4), 1, chunked.Answer{Status: 500, Body: []byte(`{"error":{"message":"engine"}}`)}, nil)}
		require.NoError(t, g.run(t, f, body10, true, false))
		b, err := io.ReadAll(f.stream)
		require.NoError(t, err)
		require.NoError(t, f.stream.Close())
		evs := events(t, b)
		require.Len(t, evs, 3, "%s", b)
		assert.Equal(t, "engine", evs[1]["error"].(map[string]any)["message"], "the engine's error object")
		assert.Nil(t, evs[2])
		assert.False(t, f.left)
		assert.Equal(t, map[string]float64{metrics.ChunkedFailed: 1}, g.outcomes())
	})
	t.Run("transport error", func(t *testing.T) {
		g := newRig()
		f := &fakeRequest{send: then(ok(4), 1, chunked.Answer{}, errors.New("reset"))}
		require.NoError(t, g.run(t, f, body10, true, false))
		b, err := io.ReadAll(f.stream)
		require.NoError(t, err)
		require.NoError(t, f.stream.Close())
		evs := events(t, b)
		require.Len(t, evs, 3, "%s", b)
		assert.Equal(t, "reset", evs[1]["error"].(map[string]any)["message"], "the sidecar's error object")
		assert.Equal(t, map[string]float64{metrics.ChunkedFailed: 1}, g.outcomes())
	})
	t.Run("client left", func(t *testing.T) {
		g := newRig()
		f := &fakeRequest{send: then(ok(4), 1, chunked.Answer{}, fmt.Errorf("cancelled: %w", errClientGone))}
		require.NoError(t, g.run(t, f, body10, true, false))
		_, err := io.ReadAll(f.stream)
		require.ErrorIs(t, err, errClientGone)
		require.NoError(t, f.stream.Close())
		assert.True(t, f.left)
		assert.Equal(t, 1, f.finished)
		assert.Equal(t, map[string]float64{metrics.ChunkedClientLeft: 1}, g.outcomes())
		assert.Zero(t, testutil.ToFloat64(g.inflight))
	})
	t.Run("closed before the end", func(t *testing.T) {
		g := newRig()
		f := &fakeRequest{send: ok(4)}
		require.NoError(t, g.run(t, f, body10, true, false))
		_, err := f.stream.Read(make([]byte, 8))
		require.NoError(t, err)
		require.NoError(t, f.stream.Close())
		assert.True(t, f.left)
		assert.Equal(t, map[string]float64{metrics.ChunkedClientLeft: 1}, g.outcomes())
	})
}
