package core

import (
	"net"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/connectors/nixlv2"
	"github.com/pd-sidecar/pd-sidecar/connectors/sglang"
	"github.com/pd-sidecar/pd-sidecar/metrics"
	"github.com/pd-sidecar/pd-sidecar/proxy/rawhttp"
)

// fakeDecoder is a decode engine that records the release legs it gets and
// answers each once gate is closed (nil: at once) with status (0: 200).
type fakeDecoder struct {
	mu     sync.Mutex
	bodies []string
	ids    []string
	gate   chan struct{}
	status int
}

func (f *fakeDecoder) serve(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := &fasthttp.Server{Handler: func(rc *fasthttp.RequestCtx) {
		f.mu.Lock()
		f.bodies = append(f.bodies, string(rc.PostBody()))
		f.ids = append(f.ids, string(rc.Request.Header.Peek(HeaderRequestID)))
		status := f.status
		f.mu.Unlock()
		if f.gate != nil {
			<-f.gate
		}
		if status != 0 {
			rc.SetStatusCode(status)
		}
		rc.SetContentType("application/json")
		rc.SetBodyString(`{"choices":[{"text":"x"}]}`)
	}}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Shutdown() })
	return ln.Addr().String()
}

func (f *fakeDecoder) got() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.bodies)
}

const releaseParams = `{"do_remote_prefill":true,"remote_engine_id":"e","remote_request_id":"r","remote_block_ids":[[1]],"remote_host":"h","remote_port":1}`

// releaseProxy is a proxy whose releaser (when on) runs until stop, or
// the end of t.
func releaseProxy(t *testing.T, conn connectors.Connector, on bool) (p *Sidecar, m *metrics.Metrics, stop func()) {
	t.Helper()
	cfg := DefaultConfig()
	cfg.ReleaseKVOnCancel = on
	m = metrics.New(prometheus.NewRegistry(), 0)
	p, err := NewSidecar(cfg, conn, m, zerolog.Nop())
	require.NoError(t, err)
	stop = func() {}
	if p.kvr != nil {
		stop = runBackground(t, p.kvr)
	}
	return p, m, stop
}

// pendingRequest is a request to local whose prefill answered with a
// handoff the decode engine has not read, and the start of its legs' head
// (rawhttp.AppendLegStartAt).
func pendingRequest(p *Sidecar, local string) (*Request, []byte) {
	var rc fasthttp.RequestCtx
	rc.Request.Header.SetMethod(fasthttp.MethodPost)
	rc.Request.SetRequestURI("/v1/completions")
	rc.Request.Header.SetContentType("application/json")
	rc.Request.Header.Set("Authorization", "Bearer k")
	rc.Request.Header.Set(HeaderPrefiller, "10.0.0.9:8000")
	body := []byte(`{"model":"m","prompt":"hi","max_tokens":9,"stream":true}`)
	r := p.StartRequest(Arrival{ID: []byte("rid"), Head: &rc.Request.Header, Body: body, Local: local, API: connectors.APICompletions})
	awaitKVRead(r, connectors.Handoff{Params: []byte(releaseParams)}, nil)
	return r, rawhttp.AppendLegStartAt(nil, &rc.Request.Header, rc.Request.Header.RequestURI(), p.LegStrip)
}

func releases(m *metrics.Metrics, how string) float64 {
	return testutil.ToFloat64(m.KVReleases.WithLabelValues(how))
}

// TestReleaseKVSendsOneTokenDecode: a request that ends with its handoff
// unread has a one-token, non-streamed decode leg with the handoff sent to
// its engine, once, under a request id of its own.
func TestReleaseKVSendsOneTokenDecode(t *testing.T) {
	f := &fakeDecoder{}
	local := f.serve(t)
	p, m, _ := releaseProxy(t, nixlv2.New(), true)
	r, start := pendingRequest(p, local)
	ReleaseKV(r, start)
	ReleaseKV(r, start) // once
	require.Eventually(t, func() bool { return releases(m, metrics.KVReleaseDecodeLeg) == 1 }, 30*time.Second, 5*time.Millisecond)
	require.Equal(t, 1, f.got())
	b := f.bodies[0]
	assert.Equal(t, "1", gjson.Get(b, "max_tokens").Raw)
	assert.Equal(t, "false", gjson.Get(b, "stream").Raw)
	assert.JSONEq(t, releaseParams, gjson.Get(b, "kv_transfer_params").Raw)
	assert.Equal(t, "rid"+kvReleaseIDSuffix, f.ids[0])
	assert.Nil(t, r.KVPending)

	// The engine's failure is counted as one.
	f.mu.Lock()
	f.status = 500
	f.mu.Unlock()
	r, start = pendingRequest(p, local)
	ReleaseKV(r, start)
	require.Eventually(t, func() bool { return releases(m, metrics.KVReleaseFailed) == 1 }, 30*time.Second, 5*time.Millisecond)
}

// TestReleaseKVNotPending: nothing is sent for a handoff the decode engine
// read (or tried to: kvHandoffDone), for one that ended generation on the
// prefill, for a failed parse, with releases off, nor for a connector whose
// prefiller pushes the KV.
func TestReleaseKVNotPending(t *testing.T) {
	f := &fakeDecoder{}
	local := f.serve(t)
	p, m, stop := releaseProxy(t, nixlv2.New(), true)
	r, start := pendingRequest(p, local)
	r.KVHandoffDone(time.Now(), false)
	ReleaseKV(r, start)
	r, start = pendingRequest(p, local)
	r.KVPending = nil
	awaitKVRead(r, connectors.Handoff{Done: true}, nil)
	awaitKVRead(r, connectors.Handoff{Params: []byte(releaseParams)}, connectors.ErrInvalidKVParams)
	ReleaseKV(r, start)
	assert.Nil(t, r.KVPending)

	off, _, _ := releaseProxy(t, nixlv2.New(), false)
	assert.Nil(t, off.kvr)
	r, start = pendingRequest(off, local)
	assert.Nil(t, r.KVPending)
	ReleaseKV(r, start)
	push, _, _ := releaseProxy(t, sglang.New(8998), true)
	assert.Nil(t, push.kvr, "sglang's prefiller pushes the KV")

	// Stopping waits for every release in flight (and cancels it, counted
	// failed): none sent is then a fact, not a pause's guess.
	stop()
	assert.Zero(t, f.got())
	assert.Zero(t, testutil.ToFloat64(m.KVReleases.WithLabelValues(metrics.KVReleaseDecodeLeg))+
		releases(m, metrics.KVReleaseFailed)+releases(m, metrics.KVReleaseOverLimit))
}

// TestReleaseLegID: the release leg carries its own id, but for a handoff
// of vLLM's oldest NIXL generation (no remote_request_id), whose decode
// side finds the blocks by the legs' shared request id.
func TestReleaseLegID(t *testing.T) {
	assert.Equal(t, "r1-kv-release", releaseLegID("r1", connectors.Handoff{Params: []byte(`{"do_remote_prefill":true,"remote_request_id":"x"}`)}))
	assert.Equal(t, "r1", releaseLegID("r1", connectors.Handoff{Params: []byte(`{"do_remote_prefill":true,"remote_engine_id":"e"}`)}))
}
