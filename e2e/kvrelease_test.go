package e2e

import (
	"os"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"

	"github.com/pd-sidecar/pd-sidecar/e2e/harness"
	"github.com/pd-sidecar/pd-sidecar/wirecorpus"
)

// --release-kv-on-cancel: a client that leaves after the prefill answered
// but before the decode engine read the KV would pin the prefiller's blocks
// until its abort timeout (a 480 s lease here, as vLLM's); the sidecar
// sends a one-token decode leg with the handoff instead, and the prefiller
// frees them at once. Both paths: the lane (sent whole) and fasthttp (the
// head in two writes).

const kvReleases = "pd_sidecar_kv_releases_total"

// kvRig is newRig with the prefiller's KV held for 480 s.
func kvRig(t *testing.T, flags ...string) *pdRig {
	t.Helper()
	r := &pdRig{
		prefill: harness.StartEngineSim(t, "prefill", "--kv-lease", "480s"),
		decode:  harness.StartEngineSim(t, "decode"),
	}
	r.sc = harness.StartSidecar(t, r.decode.Port, flags...)
	return r
}

// leaveDuringDecode sends a streamed chat split whose decode leg the decode
// engine holds for 2 s before any output, waits until the prefill answered
// and the client has waited 300 ms with nothing read, and hangs up. It
// returns when the client left.
func leaveDuringDecode(t *testing.T, rig *pdRig, whole bool) time.Time {
	t.Helper()
	setFault(t, rig.decode, `{"after_head_ms":2000,"only":"decode"}`)
	body := chatBody(`,"max_tokens":6,"stream":true,"stream_options":{"include_usage":true}`)
	conn := postRaw(t, rig.sc.Port, "/v1/chat/completions", body, rig.header(), whole)
	sent := time.Now()
	harness.Eventually(t, 30*time.Second, "the prefill answered, its KV held for the decoder", func() bool {
		return rig.prefill.Metric(t, "sim_remote_decode_prefills_total", nil) == 1 &&
			rig.prefill.Metric(t, "sim_kv_blocks_held", nil) > 0
	})
	require.NoError(t, conn.SetReadDeadline(sent.Add(300*time.Millisecond)))
	_, err := conn.Read(make([]byte, 1))
	require.ErrorIs(t, err, os.ErrDeadlineExceeded, "the client got nothing before it left")
	require.NoError(t, conn.Close())
	return time.Now()
}

func TestReleaseKVOnCancel(t *testing.T) {
	for _, whole := range []bool{true, false} {
		name := map[bool]string{true: "lane", false: "fasthttp"}[whole]
		t.Run(name+"/released", func(t *testing.T) {
			rig := kvRig(t)
			left := leaveDuringDecode(t, rig, whole)
			// The release leg frees it, long before the 480 s lease could.
			harness.Eventually(t, 30*time.Second, "the prefiller freed the KV within 30 s of the client leaving", func() bool {
				return rig.prefill.Metric(t, "sim_kv_blocks_held", nil) == 0
			})
			t.Logf("%s: prefiller KV freed %v after the client left", name, time.Since(left).Round(time.Millisecond))
			harness.Eventually(t, 30*time.Second, "the release counted", func() bool {
				return rig.scMetric(t, kvReleases, map[string]string{"how": "decode_leg"}) == 1
			})
			assert.Equal(t, 1.0, rig.scMetric(t, kvReleases, nil), "one release, nothing else counted")
			assert.Equal(t, 1.0, rig.scMetric(t, "pd_sidecar_client_disconnects_total", map[string]string{"phase": "decode"}))
			assert.Equal(t, 1.0, rig.scMetric(t, "pd_sidecar_requests_total", map[string]string{"code": "499"}))
			assert.Zero(t, rig.prefill.Metric(t, "sim_kv_lease_expired_total", nil), "freed by the pull, not the lease")
			// The decode engine read the KV once (the release) and made one
			// token, which nobody got: the client had left with nothing.
			assert.Equal(t, 1.0, rig.decode.Metric(t, "sim_remote_kv_decodes_total", nil))
			assert.Equal(t, 1.0, rig.decode.Metric(t, "vllm:generation_tokens_total", nil), "only the release's token was made")
			reqs := simRequests(t, rig.decode)
			require.Len(t, reqs, 2, "the client's decode leg and the release leg")
			dec, rel := string(reqs[0].Body), string(reqs[1].Body)
			assert.True(t, gjson.Get(dec, "stream").Bool())
			assert.Equal(t, gjson.Get(dec, "kv_transfer_params").Raw, gjson.Get(rel, "kv_transfer_params").Raw, "the same handoff")
			assert.Equal(t, "false", gjson.Get(rel, "stream").Raw)
			assert.Equal(t, "1", gjson.Get(rel, "max_tokens").Raw)
			assert.False(t, gjson.Get(rel, "stream_options").Exists())
			assert.Equal(t, gjson.Get(dec, "messages").Raw, gjson.Get(rel, "messages").Raw)
			id := reqs[0].Headers["x-request-id"]
			require.Len(t, id, 1)
			want := id[0] + "-kv-release"
			if shape, err := wirecorpus.Get(harness.WireShape()); err == nil && !slices.Contains(shape.Members(), "remote_request_id") {
				want = id[0] // the oldest NIXL generation finds the blocks by the legs' own id
			}
			assert.Equal(t, []string{want}, reqs[1].Headers["x-request-id"])
			assert.Empty(t, reqs[1].Headers["x-prefiller-host-port"])
		})
		t.Run(name+"/off", func(t *testing.T) {
			rig := kvRig(t, "--release-kv-on-cancel=false")
			leaveDuringDecode(t, rig, whole)
			until := time.Now().Add(1500 * time.Millisecond)
			for time.Now().Before(until) {
				require.Positive(t, rig.prefill.Metric(t, "sim_kv_blocks_held", nil), "no release: the prefiller keeps the KV")
				time.Sleep(100 * time.Millisecond)
			}
			assert.Zero(t, rig.scMetric(t, kvReleases, nil))
			assert.Zero(t, rig.decode.Metric(t, "sim_remote_kv_decodes_total", nil))
			assert.Len(t, simRequests(t, rig.decode), 1, "no release leg")
		})
		t.Run(name+"/completed split releases nothing", func(t *testing.T) {
			rig := kvRig(t)
			stream := chatBody(`,"max_tokens":6,"stream":true`)
			o := sendRaw(t, rig.sc.Port, "/v1/chat/completions", stream, rig.header(), whole, 0)
			require.Equal(t, 200, o.status, o.answer)
			o = sendRaw(t, rig.sc.Port, "/v1/completions", completionBody(`,"max_tokens":6`), rig.header(), whole, 0)
			require.Equal(t, 200, o.status, o.answer)
			harness.Eventually(t, 30*time.Second, "the decodes read the KV", func() bool {
				return rig.prefill.Metric(t, "sim_kv_blocks_held", nil) == 0
			})
			time.Sleep(200 * time.Millisecond) // a release would be sent at once
			assert.Zero(t, rig.scMetric(t, kvReleases, nil))
			assert.Equal(t, 2.0, rig.decode.Metric(t, "sim_remote_kv_decodes_total", nil))
			assert.Equal(t, 12.0, rig.decode.Metric(t, "vllm:generation_tokens_total", nil), "no token but the answers'")
			assert.Len(t, simRequests(t, rig.decode), 2)
			wantLane := 0.0
			if whole {
				wantLane = 2
			}
			assert.Equal(t, wantLane, rig.scMetric(t, laneRequests, nil))
		})
	}
}
