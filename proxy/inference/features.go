package inference

import (
	"net"
	"strconv"

	"github.com/valyala/fasthttp"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/metrics"
	"github.com/pd-sidecar/pd-sidecar/proxy/feature"
)

// The request features (proxy/feature) take part in a request at the
// points both drivers pass through: BeginFeatures once the prefiller is
// named and allowed (or none is), then SplitDeclined, EditPrefill or
// EditLocal, and KVSourcePeer for a choreography whose legs name the
// source. They are asked in the order of the one list New registers them
// in (Proxy.features).

// BeginFeatures asks every feature for its part in r, whose head is h. A
// feature that declines the split is counted and reported here, and the
// request is then served in mode local.
func (r *Request) BeginFeatures(h *fasthttp.RequestHeader) {
	if len(r.P.features) == 0 {
		return
	}
	fr := feature.Request{API: r.API, Body: r.Body, Prefiller: r.Prefiller, Port: r.P.Cfg.Port + r.rank(), Log: r}
	for _, f := range r.P.features {
		u := f.Begin(fr, h)
		if u == nil {
			continue
		}
		r.uses = append(r.uses, u)
		if d, ok := u.(feature.SplitDecliner); ok && !r.declined {
			reason := d.DeclinedSplit()
			r.P.M.SplitDeclined.WithLabelValues(reason).Inc()
			r.Obs.Declined = reason
			r.Mode = metrics.ModeLocal
			r.declined = true
		}
	}
}

// SplitDeclined reports whether a feature serves r locally instead of
// splitting it.
func (r *Request) SplitDeclined() bool { return r.declined }

// EditPrefill gives the prefill leg's body to every feature that edits it.
func (r *Request) EditPrefill(body []byte) ([]byte, error) {
	for _, u := range r.uses {
		if e, ok := u.(feature.PrefillEditor); ok {
			var err error
			if body, err = e.EditPrefill(body); err != nil {
				return nil, err
			}
		}
	}
	return body, nil
}

// EditLocal gives the body of a request served locally to every feature
// that edits it.
func (r *Request) EditLocal(body []byte) ([]byte, error) {
	for _, u := range r.uses {
		if e, ok := u.(feature.LocalEditor); ok {
			var err error
			if body, err = e.EditLocal(body); err != nil {
				return nil, err
			}
		}
	}
	return body, nil
}

// KVSourcePeer is the request's KV cache source (nil: none), for a
// choreography whose legs name it themselves (the offloading connector's).
func (r *Request) KVSourcePeer() *connectors.P2PPeer {
	for _, u := range r.uses {
		if s, ok := u.(feature.KVSourceNamer); ok {
			if peer := s.KVSource(); peer != nil {
				return peer
			}
		}
	}
	return nil
}

// rank is the data-parallel rank r arrived on (its home engine's).
func (r *Request) rank() int {
	_, port, _ := net.SplitHostPort(r.Home)
	n, _ := strconv.Atoi(port)
	return n - r.P.Cfg.ModelServerPort
}
