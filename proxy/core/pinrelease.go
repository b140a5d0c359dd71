package core

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/metrics"
	"github.com/pd-sidecar/pd-sidecar/proxy/kvrelease"
	"github.com/pd-sidecar/pd-sidecar/proxy/multiturn"
	"github.com/pd-sidecar/pd-sidecar/proxy/rawhttp"
	"github.com/pd-sidecar/pd-sidecar/ssrf"
)

// Freeing the decode engine's pinned histories no turn will read
// (--bidirectional-release-unread). With vLLM's bidirectional_kv_xfer the
// decode engine pins every finished split answer's blocks for
// decoder_kv_blocks_ttl (480 s); only an engine that reads the pin, or is
// given it and pulls nothing, frees it sooner — nothing else, no API route
// nor abort, does. So for a pin multi-turn reuse knows no turn will read
// (proxy/multiturn decides which), a one-token prefill leg carrying the pin
// is sent in the background to the prefill engine of the split that left
// it, which pulls nothing and tells the decode engine to free it.

// pinReleaser is multiturn.PinReleaser over a kvrelease.Releaser of
// kvrelease.PinLegs: bounded legs in flight, each bounded in time,
// counted in pd_sidecar_multiturn_pin_releases_total.
type pinReleaser struct {
	r *kvrelease.Releaser
	// allowlist is SSRF protection's (nil: off): a prefiller is checked
	// again when its release leg goes, which may be long after the split
	// that named it (an entry evicted minutes later), by when it may have
	// left the allowlist.
	allowlist ssrf.Allowlist
	counts    *prometheus.CounterVec
	log       zerolog.Logger
}

func newPinReleaser(p *Sidecar) *pinReleaser {
	return &pinReleaser{r: kvrelease.New(kvrelease.PinLegs, nil, p.Tr, p.M.Multiturn.PinReleases),
		allowlist: p.Cfg.Guard.Allowlist, counts: p.M.Multiturn.PinReleases, log: p.Log}
}

// pinReleaseHead begins a release leg's head: the path and the one header
// of its own (the legs carry no client header: no client is behind them).
const pinReleaseHead = "POST /v1/completions HTTP/1.1\r\nContent-Type: application/json\r\n"

// ReleasePin sends body (multiturn.ReleaseBody) to prefiller in the
// background under a request id of its own.
func (pr *pinReleaser) ReleasePin(prefiller string, body []byte) {
	id := "history-release-" + NewUUID()
	lg := pr.log.With().Str("request_id", id).Str("prefiller", prefiller).Str("kv_release", "history_pin").Logger()
	if pr.allowlist != nil && !pr.allowlist.Allowed(prefiller) {
		pr.counts.WithLabelValues(metrics.PinReleaseNotAllowed).Inc()
		lg.Info().Msg("decode engine's pinned history not released: its prefiller has left the allowlist; the pin lasts its TTL")
		return
	}
	pr.r.Release(prefiller, lg, func(connectors.KVReleaser) ([]byte, error) {
		raw := rawhttp.AppendLegEnd([]byte(pinReleaseHead), prefiller, id, len(body))
		return append(raw, body...), nil
	})
}

var _ multiturn.PinReleaser = (*pinReleaser)(nil)
