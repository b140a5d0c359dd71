package e2e

import (
	"bytes"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"

	"github.com/pd-sidecar/pd-sidecar/e2e/harness"
	"github.com/pd-sidecar/pd-sidecar/status"
)

// A newer engine's prefill answer: members the connector does not document
// pass to the decode engine unchanged when they name no address (counted,
// shown by the status view), or are refused on request; one that could
// name an address never reaches an engine; a side-channel host given as a
// name other than the prefiller's is replaced by the prefiller's own host.
// The prefiller is a real engine-sim behind an editing relay, so a split
// that goes through is proved by the decode engine's pull.

// editingPrefiller relays prefill legs to a real prefill engine and edits
// the kv_transfer_params of its answers with edit.
type editingPrefiller struct {
	addr string
	mu   sync.Mutex
	edit func(params []byte) []byte
}

// setEdit makes edit the relay's edit from the next answer on.
func (p *editingPrefiller) setEdit(edit func([]byte) []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.edit = edit
}

func startEditingPrefiller(t *testing.T, upstream *harness.Engine, edit func([]byte) []byte) *editingPrefiller {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &editingPrefiller{addr: l.Addr().String(), edit: edit}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		req, _ := http.NewRequestWithContext(r.Context(), r.Method, upstream.URL()+r.URL.Path, bytes.NewReader(body))
		req.Header = r.Header.Clone()
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			w.WriteHeader(http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		answer, _ := io.ReadAll(resp.Body)
		if kv := gjson.GetBytes(answer, "kv_transfer_params"); kv.IsObject() {
			p.mu.Lock()
			edit := p.edit
			p.mu.Unlock()
			answer, _ = sjson.SetRawBytes(answer, "kv_transfer_params", edit([]byte(kv.Raw)))
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(resp.StatusCode)
		_, _ = w.Write(answer)
	})}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	return p
}

// lastDecodeParams is the kv_transfer_params of the last inference request
// the decode engine received.
func lastDecodeParams(t *testing.T, decode *harness.Engine) gjson.Result {
	t.Helper()
	reqs := simRequests(t, decode)
	require.NotEmpty(t, reqs)
	return gjson.GetBytes(reqs[len(reqs)-1].Body, "kv_transfer_params")
}

func TestKVParamsUnknownMembers(t *testing.T) {
	prefill := harness.StartEngineSim(t, "prefill")
	decode := harness.StartEngineSim(t, "decode")
	set := func(member, raw string) func([]byte) []byte {
		return func(p []byte) []byte { out, _ := sjson.SetRawBytes(p, member, []byte(raw)); return out }
	}
	body := completionBody(`,"max_tokens":5`)
	_, local, _ := scPost(t, decode.URL()+"/v1/completions", body, nil)
	invalid := map[string]string{"reason": "invalid_kv_params"}
	for _, mode := range serveModes {
		t.Run(mode.name, func(t *testing.T) {
			relay := startEditingPrefiller(t, prefill, set("kv_layout_hint", `{"v":3,"flags":[1,true,"HND_V2"]}`))
			sc := harness.StartSidecar(t, decode.Port, append(append(ssrfFlags(relay.addr), "--engine-info-interval", "1m"), mode.flags...)...)
			strict := harness.StartSidecar(t, decode.Port, append(append(ssrfFlags(relay.addr), "--kv-params-unknown-members=refuse"), mode.flags...)...)
			hdr := map[string]string{"x-prefiller-host-port": relay.addr}

			t.Run("an undocumented scalar member reaches the decode engine", func(t *testing.T) {
				before := decodeCounts(t, decode)
				st, b, _ := scPost(t, sc.URL()+"/v1/completions", body, hdr)
				require.Equal(t, 200, st, "%s", b)
				assert.Equal(t, textOf(local), textOf(b))
				assert.Equal(t, before[0]+1, decodeCounts(t, decode)[0], "decoded on pulled KV")
				assert.JSONEq(t, `{"v":3,"flags":[1,true,"HND_V2"]}`, lastDecodeParams(t, decode).Get("kv_layout_hint").Raw, "unchanged")
				assert.Equal(t, 1.0, sc.Metric(t, "pd_sidecar_kv_params_unknown_members_total", map[string]string{"connector": "nixlv2", "member": "kv_layout_hint"}))
				assert.Zero(t, sc.Metric(t, "pd_sidecar_fallbacks_total", nil))
				snap, err := status.Fetch(t.Context(), nil, sc.URL())
				require.NoError(t, err)
				assert.Equal(t, []string{"kv_layout_hint"}, snap.UnknownKVMembers)
				assert.Contains(t, sc.Output(), "does not document")
			})
			t.Run("refused when strict", func(t *testing.T) {
				before := decodeCounts(t, decode)
				st, b, _ := scPost(t, strict.URL()+"/v1/completions", body, hdr)
				require.Equal(t, 200, st, "%s", b)
				assert.Equal(t, textOf(local), textOf(b), "the local prefill's tokens")
				assert.Equal(t, 1.0, strict.Metric(t, "pd_sidecar_fallbacks_total", invalid))
				assert.Equal(t, before[0], decodeCounts(t, decode)[0])
				assert.False(t, lastDecodeParams(t, decode).Exists(), "the decode engine got no params")
			})
			for _, addr := range []string{`"10.9.9.9"`, `"prefill-1.pool.svc:5600"`, `{"peer":{"host":"localhost"}}`, `["http://10.9.9.9/"]`} {
				t.Run("an undocumented member naming "+addr, func(t *testing.T) {
					relay.setEdit(set("next_peer", addr))
					fallbacks := sc.Metric(t, "pd_sidecar_fallbacks_total", invalid)
					st, b, _ := scPost(t, sc.URL()+"/v1/completions", body, hdr)
					require.Equal(t, 200, st, "%s", b)
					assert.Equal(t, textOf(local), textOf(b))
					assert.Equal(t, fallbacks+1, sc.Metric(t, "pd_sidecar_fallbacks_total", invalid))
					assert.False(t, lastDecodeParams(t, decode).Exists(), "nothing of it reached the decode engine")
					assert.Contains(t, sc.Output(), `"kv_params":"a generation the corpus does not know (members: `, "the fallback names the generation")
					assert.NotContains(t, sc.Output(), "10.9.9.9", "never the value")
				})
			}
			t.Run("a side-channel host name is the prefiller's host", func(t *testing.T) {
				relay.setEdit(set("remote_host", `"localhost"`)) // vLLM's default VLLM_NIXL_SIDE_CHANNEL_HOST
				before := decodeCounts(t, decode)
				st, b, _ := scPost(t, sc.URL()+"/v1/completions", body, hdr)
				require.Equal(t, 200, st, "%s", b)
				assert.Equal(t, textOf(local), textOf(b))
				assert.Equal(t, before[0]+1, decodeCounts(t, decode)[0], "decoded on pulled KV")
				assert.Equal(t, "127.0.0.1", lastDecodeParams(t, decode).Get("remote_host").Str)
				assert.Equal(t, 1.0, sc.Metric(t, "pd_sidecar_kv_params_hosts_replaced_total", nil))
			})
			t.Run("the local engine's version", func(t *testing.T) {
				harness.Eventually(t, 10*time.Second, "the version read", func() bool {
					return sc.Metric(t, "pd_sidecar_engine_info", map[string]string{"engine": "vllm", "version": "engine-sim+vllm-nixl-pull-0050936b"}) == 1
				})
				snap, err := status.Fetch(t.Context(), nil, sc.URL())
				require.NoError(t, err)
				assert.Equal(t, "vllm", snap.Engine)
				assert.Equal(t, "engine-sim+vllm-nixl-pull-0050936b", snap.EngineVersion)
			})
			alive(t, sc)
		})
	}
}
