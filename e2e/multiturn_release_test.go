package e2e

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"

	"github.com/pd-sidecar/pd-sidecar/e2e/harness"
)

// pinReleases is pd_sidecar_multiturn_pin_releases_total{outcome}.
func pinReleases(t *testing.T, r *mtRig, outcome string) float64 {
	t.Helper()
	return r.sc.Metric(t, "pd_sidecar_multiturn_pin_releases_total", map[string]string{"outcome": outcome})
}

// TestMultiturnReleasesUnreadPins: a pin no turn will read is freed on the
// decode engine long before its decoder_kv_blocks_ttl (8 minutes here):
// an answer with reasoning (not kept by default), and a history evicted
// for room (one entry kept). The sidecar sends the split's prefiller a
// one-token prefill leg carrying the pin; the prefiller pulls nothing and
// frees it on the decode engine, whose held blocks go to those of the
// histories still kept. A history that stays is still used. With
// --bidirectional-release-unread=false the pin stays.
func TestMultiturnReleasesUnreadPins(t *testing.T) {
	t.Run("not kept (reasoning)", func(t *testing.T) {
		drivers(t, func(t *testing.T, whole bool) {
			r := newMTRig(t, whole, nil, []string{"--reasoning-tokens", "6"})
			r.turnWith(t, []map[string]any{user(400, 120)}, nil, false)
			require.Equal(t, 1.0, r.decode.Metric(t, "sim_bidirectional_pins_total", nil), "the decode engine pinned the answer")
			harness.Eventually(t, 20*time.Second, "the pin freed", func() bool {
				return r.decode.Metric(t, "sim_kv_blocks_held", nil) == 0
			})
			assert.Equal(t, 1.0, pinReleases(t, r, "sent"))
			assert.Equal(t, 1.0, r.sc.Metric(t, "pd_sidecar_multiturn_entries_total", map[string]string{"outcome": "not_kept"}))
			assert.Equal(t, 0.0, r.sc.Metric(t, "pd_sidecar_multiturn_pinned_tokens", nil))
			reqs := simRequests(t, r.prefill)
			leg := reqs[len(reqs)-1].Body
			assert.Equal(t, "release", gjson.GetBytes(leg, "prompt").Str, "the prefiller's last request is the release leg: %s", leg)
			assert.True(t, gjson.GetBytes(leg, "kv_transfer_params.remote_block_ids").IsArray(), "carrying the pin")
			assert.Equal(t, 0.0, r.prefill.Metric(t, "sim_bidirectional_history_blocks_pulled_total", nil), "nothing pulled")
		})
	})
	t.Run("evicted for room", func(t *testing.T) {
		drivers(t, func(t *testing.T, whole bool) {
			r := newMTRig(t, whole, nil, nil, "--bidirectional-cache-size", "1")
			first := []map[string]any{user(410, 120)}
			r.turnWith(t, first, nil, false)
			held := r.decode.Metric(t, "sim_kv_blocks_held", nil)
			require.Greater(t, held, 0.0)
			second := []map[string]any{user(411, 120)}
			a := r.turnWith(t, second, nil, true)
			harness.Eventually(t, 20*time.Second, "the evicted history's pin freed", func() bool {
				return pinReleases(t, r, "sent") == 1 && r.decode.Metric(t, "sim_kv_blocks_held", nil) == held
			})
			assert.Equal(t, 1.0, r.sc.Metric(t, "pd_sidecar_multiturn_evictions_total", map[string]string{"reason": "client_share"})+
				r.sc.Metric(t, "pd_sidecar_multiturn_evictions_total", map[string]string{"reason": "full"}))
			before := r.counts(t)
			msgs := append(append([]map[string]any{}, second...), a.message(false), user(412, 60))
			got := r.turnWith(t, msgs, nil, false)
			after := r.counts(t)
			assert.Equal(t, r.localTurn(t, msgs).content, got.content)
			assert.Equal(t, before.uses+1, after.uses, "the history kept is used")
		})
	})
	t.Run("off", func(t *testing.T) {
		r := newMTRig(t, true, nil, []string{"--reasoning-tokens", "6"}, "--bidirectional-release-unread=false")
		r.turnWith(t, []map[string]any{user(420, 120)}, nil, false)
		time.Sleep(500 * time.Millisecond)
		assert.Greater(t, r.decode.Metric(t, "sim_kv_blocks_held", nil), 0.0, "the pin lasts its TTL")
		assert.Equal(t, 0.0, pinReleases(t, r, "sent"))
		assert.Greater(t, r.sc.Metric(t, "pd_sidecar_multiturn_pinned_tokens", nil), 0.0, "counted pinned")
	})
}
