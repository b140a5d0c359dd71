package core

import (
	"github.com/tidwall/gjson"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/proxy/kvrelease"
	"github.com/pd-sidecar/pd-sidecar/proxy/rawhttp"
	"github.com/pd-sidecar/pd-sidecar/proxy/split"
)

// Freeing the prefiller's KV when the client leaves (--release-kv-on-cancel).
//
// After a successful nixlv2 prefill the prefill engine holds the prompt's
// blocks until a decoder reads them; vLLM frees them otherwise only after
// VLLM_NIXL_ABORT_REQUEST_TIMEOUT (480 s). A client that leaves between the
// prefill answer and the decode leg's first output (or before the decode
// leg is sent) would pin them that long. So a request remembers the handoff
// from the moment its prefill answer is parsed (awaitKVRead) until its
// decode leg's first output or KV load failure (kvHandoffDone); a request
// that ends with it still pending has a minimal decode leg sent for it in
// the background (kvrelease.Releaser): the decode body capped at one token,
// not streamed, its answer read and discarded. The decode engine reads the
// blocks and the prefill engine frees them at once.

// kvReleaseIDSuffix marks the release leg's X-Request-ID: the client's own
// decode leg may still be aborting on the engine under its id.
const kvReleaseIDSuffix = "-kv-release"

// releaseLegID is the X-Request-ID of the release leg of request id's
// handoff h: id with kvReleaseIDSuffix, unless the prefill engine named no
// remote_request_id (vLLM's NIXL connector before version 2), whose decode
// side finds the blocks by its own request id, the legs' shared one.
func releaseLegID(id string, h connectors.Handoff) string {
	if !gjson.GetBytes(h.Params, "remote_request_id").Exists() {
		return id
	}
	return id + kvReleaseIDSuffix
}

// newKVReleaser returns the releaser of p, or nil when releases are off or
// its connector's prefiller pins nothing for a decoder that never comes
// (only a KVReleaser's decoder pulls; MoRI-IO write mode pushes the KV
// into the decoder from the prefiller).
func newKVReleaser(p *Sidecar) *kvrelease.Releaser {
	c, ok := p.Conn.(connectors.KVReleaser)
	if !p.Cfg.ReleaseKVOnCancel || !ok || p.seq == nil || p.Mori != nil {
		return nil
	}
	return kvrelease.New(kvrelease.DecodeLegs, c, p.Tr, p.M.KVReleases)
}

// awaitKVRead records the handoff of a parsed prefill answer as pending a
// read by the decode engine (nothing when releases are off, or the answer
// has nothing to read: an error, or generation ended on the first token).
func awaitKVRead(r *Request, h connectors.Handoff, err error) {
	if r.P.kvr == nil || err != nil || h.Done || h.Params == nil {
		return
	}
	r.KVPending = &h
}

// ReleaseKV sends the release leg of a request that ends with its handoff
// still pending a read (see awaitKVRead), once. start is the start of the
// request's legs' head (rawhttp.AppendLegStart; inference.Proxy.LegStart). The leg's request is built here, as a copy, before
// the request's buffers are given back; only its sending is left to the
// background.
func ReleaseKV(r *Request, start []byte) {
	h, kr := r.KVPending, r.P.kvr
	r.KVPending = nil
	if h == nil || kr == nil {
		return
	}
	if split.TPGuard(r.P.Cfg.DecodeTPSize, *h) != nil {
		return // a handoff the decode engine is not to read
	}
	start = append([]byte(nil), start...)
	lg := r.Logger().With().Str("kv_release", "decode_leg").Logger()
	kr.Release(r.Local, lg, func(conn connectors.KVReleaser) ([]byte, error) {
		body, err := conn.ReleaseBody(nil, r.API, r.Body, *h)
		if err != nil {
			return nil, err
		}
		raw := rawhttp.AppendLegEnd(start, r.Local, releaseLegID(r.ID, *h), len(body))
		return append(raw, body...), nil
	})
}

var _ Background = (*kvrelease.Releaser)(nil)
