package chunked_test

import (
	"errors"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd-sidecar/pd-sidecar/metrics"
	"github.com/pd-sidecar/pd-sidecar/proxy/chunked"
)

// fakeRecorder is the machine's request: a client that may have left,
// and what the machine told it.
type fakeRecorder struct {
	gone   bool
	left   bool
	chunks int
}

func (f *fakeRecorder) Gone() bool                       { return f.gone }
func (f *fakeRecorder) Left()                            { f.left = true }
func (f *fakeRecorder) Report(chunks int)                { f.chunks = chunks }
func (f *fakeRecorder) Log(zerolog.Level) *zerolog.Event { return nil }

// step is one event fed to the machine and the ops it must answer with.
type step struct {
	ev   string // answer, answer-done, error-status, transport, kv-load, client-gone, gone-now, written, refused, closed, closed-short
	want []chunked.Op
}

// TestMachineEventOrders drives the machine without sockets through
// every order of chunk answers, failures, stream writes and the client
// leaving, and checks what it asks of its driver and how it counts the
// decode: once, by outcome, with nothing left in flight.
func TestMachineEventOrders(t *testing.T) {
	send := []chunked.Op{chunked.SendChunk}
	write := []chunked.Op{chunked.WriteEvents}
	last := []chunked.Op{chunked.WriteEvents, chunked.EndStream}
	whole := []chunked.Op{chunked.AnswerWhole}
	ret := []chunked.Op{chunked.Return}
	abort := []chunked.Op{chunked.AbortStream}
	begin := []chunked.Op{chunked.BeginStream}
	tests := []struct {
		name    string
		stream  bool
		steps   []step
		outcome string
		left    bool
	}{
		{"JSON: three chunks, one answer", false,
			[]step{{"answer", send}, {"answer", send}, {"answer-done", whole}}, metrics.ChunkedCompleted, false},
		{"JSON: the engine's error mid-decode is the answer", false,
			[]step{{"answer", send}, {"error-status", whole}}, metrics.ChunkedFailed, false},
		{"JSON: a transport failure is the caller's", false,
			[]step{{"answer", send}, {"transport", ret}}, metrics.ChunkedFailed, false},
		{"JSON: the split's KV could not be loaded", false,
			[]step{{"kv-load", ret}}, metrics.ChunkedFallback, false},
		{"JSON: the client left while a chunk ran", false,
			[]step{{"answer", send}, {"client-gone", ret}}, metrics.ChunkedClientLeft, false},
		{"stream: begun after the first chunk, written chunk by chunk", true,
			[]step{{"answer", begin}, {"written", send}, {"answer", write}, {"written", send}, {"answer-done", last}, {"closed", nil}},
			metrics.ChunkedCompleted, false},
		{"stream: ends with its first chunk, answered whole", true,
			[]step{{"answer-done", whole}}, metrics.ChunkedCompleted, false},
		{"stream: the client left as it began", true,
			[]step{{"answer", begin}, {"refused", ret}}, metrics.ChunkedClientLeft, false},
		{"stream: the engine's error mid-stream is an error event", true,
			[]step{{"answer", begin}, {"written", send}, {"error-status", last}, {"closed", nil}}, metrics.ChunkedFailed, false},
		{"stream: a transport failure mid-stream is an error event", true,
			[]step{{"answer", begin}, {"written", send}, {"transport", last}, {"closed", nil}}, metrics.ChunkedFailed, false},
		{"stream: the client left while a chunk ran", true,
			[]step{{"answer", begin}, {"written", send}, {"client-gone", abort}, {"closed-short", nil}}, metrics.ChunkedClientLeft, true},
		{"stream: the client left as a chunk answered", true,
			[]step{{"answer", begin}, {"written", send}, {"gone-now", abort}, {"closed-short", nil}}, metrics.ChunkedClientLeft, true},
		{"stream: closed before its last bytes reached the client", true,
			[]step{{"answer", begin}, {"written", send}, {"answer", write}, {"written", send}, {"answer-done", last}, {"closed-short", nil}},
			metrics.ChunkedClientLeft, true},
		{"stream: closed while a chunk ran", true,
			[]step{{"answer", begin}, {"written", send}, {"closed-short", nil}, {"answer", nil}, {"written", nil}}, metrics.ChunkedClientLeft, true},
		{"stream: a failure after the end changes nothing", true,
			[]step{{"answer", begin}, {"written", send}, {"answer", write}, {"written", send}, {"answer-done", last}, {"transport", nil}, {"closed", nil}},
			metrics.ChunkedCompleted, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			g := newRig()
			rec := &fakeRecorder{}
			plan, ok := chunked.PlanFor([]byte(body10), 4)
			require.True(t, ok)
			m := chunked.NewMachine(g.deps, rec, chunked.Job{Plan: plan, Body: []byte(body10), Stream: tc.stream, Usage: true, Remote: true, Inflight: g.inflight})
			require.Equal(t, []chunked.Op{chunked.SendChunk}, ops(m.Start()))
			assert.Equal(t, 1.0, testutil.ToFloat64(g.inflight))
			for i, s := range tc.steps {
				var acts []chunked.Action
				switch s.ev {
				case "answer":
					acts = m.Answered(chunked.Answer{Status: 200, Body: chatAnswer(" t", "length", 5, 4)})
				case "answer-done":
					acts = m.Answered(chunked.Answer{Status: 200, Body: chatAnswer(" end", "stop", 5, 1)})
				case "error-status":
					acts = m.Answered(chunked.Answer{Status: 503, Body: []byte(`{"error":{"message":"busy"}}`)})
				case "transport":
					acts = m.Failed(errors.New("reset"))
				case "kv-load":
					acts = m.Failed(errKVLoadFailed)
				case "client-gone":
					acts = m.Failed(errClientGone)
				case "gone-now":
					rec.gone = true
					acts = m.Answered(chunked.Answer{Status: 200, Body: chatAnswer(" t", "length", 5, 4)})
				case "written":
					acts = m.Written()
				case "refused":
					acts = m.StreamRefused()
				case "closed":
					m.Closed(true)
				case "closed-short":
					m.Closed(false)
				}
				require.Equal(t, s.want, ops(acts), "step %d (%s)", i, s.ev)
				for _, a := range acts {
					if a.Op == chunked.SendChunk {
						assert.False(t, a.Handoff, "only the first chunk carries the handoff")
					}
				}
			}
			assert.Equal(t, map[string]float64{tc.outcome: 1}, g.outcomes(), "counted once")
			assert.Zero(t, testutil.ToFloat64(g.inflight))
			assert.Equal(t, tc.left, rec.left, "a client that left mid-stream is recorded")
			assert.Equal(t, m.Chunks(), rec.chunks, "the report's chunk count")
		})
	}
}

// The first chunk of a split carries the handoff; a decode's answer
// after the stream began is its text events, the last its end.
func TestMachineFirstChunkAndEvents(t *testing.T) {
	g := newRig()
	plan, _ := chunked.PlanFor([]byte(body10), 4)
	m := chunked.NewMachine(g.deps, &fakeRecorder{}, chunked.Job{Plan: plan, Body: []byte(body10), Stream: true, Usage: true, Remote: true, Inflight: g.inflight})
	acts := m.Start()
	require.Len(t, acts, 1)
	assert.True(t, acts[0].Handoff)
	begin := m.Answered(chunked.Answer{Status: 200, Body: chatAnswer(" a", "length", 5, 4)})
	require.Len(t, begin, 1)
	evs := events(t, begin[0].Body)
	require.Len(t, evs, 1)
	assert.Equal(t, "assistant", evs[0]["choices"].([]any)[0].(map[string]any)["delta"].(map[string]any)["role"])
	m.Written()
	end := m.Answered(chunked.Answer{Status: 200, Body: chatAnswer(" b", "stop", 5, 2)})
	require.Len(t, end, 2)
	evs = events(t, end[0].Body)
	require.Len(t, evs, 4, "%s", end[0].Body) // text, finish, usage, [DONE]
	assert.Nil(t, evs[3])
}

func ops(acts []chunked.Action) []chunked.Op {
	var out []chunked.Op
	for _, a := range acts {
		out = append(out, a.Op)
	}
	return out
}

// TestMachineEditsTheWholeAnswer: the JSON answer, made of the last
// chunk's, goes through the job's edit before it is written.
func TestMachineEditsTheWholeAnswer(t *testing.T) {
	g := newRig()
	plan, _ := chunked.PlanFor([]byte(body10), 4)
	var edited []string
	edit := func(b []byte) []byte {
		edited = append(edited, string(b))
		return []byte(`{"edited":true}`)
	}
	m := chunked.NewMachine(g.deps, &fakeRecorder{}, chunked.Job{Plan: plan, Body: []byte(body10), Inflight: g.inflight, Edit: edit})
	m.Start()
	m.Answered(chunked.Answer{Status: 200, Body: chatAnswer(" a", "length", 5, 4)})
	end := m.Answered(chunked.Answer{Status: 200, Body: chatAnswer(" b", "stop", 5, 2)})
	require.Len(t, end, 1)
	assert.Equal(t, chunked.AnswerWhole, end[0].Op)
	assert.Equal(t, `{"edited":true}`, string(end[0].Body))
	require.Len(t, edited, 1)
	assert.Contains(t, edited[0], `"content":" a b"`, "the edit gets the whole answer")
}
