package inference

import (
	"context"
	"io"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pd-sidecar/pd-sidecar/proxy/engineinfo"
)

// maxEngineInfoBytes bounds a version answer (SGLang's server info lists
// its settings: a few KiB).
const maxEngineInfoBytes = 64 << 10

// newEngineInfo returns the watch of the local engine's (rank 0's)
// version, every --engine-info-interval (an engine restarted on a new
// image answers another): exported as pd_sidecar_engine_info, logged when
// it changes, shown by the status view (EngineInfo).
func newEngineInfo(p *Proxy) *engineinfo.Watcher {
	local := p.LocalAddr(0)
	get := func(ctx context.Context, path string) (int, []byte, error) {
		req := fasthttp.AcquireRequest()
		resp := fasthttp.AcquireResponse()
		defer fasthttp.ReleaseRequest(req)
		defer fasthttp.ReleaseResponse(resp)
		req.Header.SetMethod(fasthttp.MethodGet)
		req.Header.SetRequestURI(path)
		req.Header.SetHost(local)
		ctx, cancel := context.WithTimeout(ctx, p.Cfg.ConnectTimeout+5*time.Second)
		defer cancel()
		// Streamed and read with a bound of its own: a version answer is
		// small, and it takes nothing from the requests' --max-buffered-bytes.
		leg, err := p.Tr.Stream(ctx, local, req, resp)
		if err != nil {
			return 0, nil, err
		}
		defer leg.Close()
		body, err := io.ReadAll(io.LimitReader(leg, maxEngineInfoBytes+1))
		if err != nil {
			return 0, nil, err
		}
		if len(body) > maxEngineInfoBytes {
			return resp.StatusCode(), nil, nil // no version read: too long
		}
		return resp.StatusCode(), body, nil
	}
	g := p.M.Wire.EngineInfo
	return engineinfo.New(get, p.Cfg.EngineInfoInterval, func(old, now engineinfo.Info) {
		g.Reset()
		g.WithLabelValues(now.Engine, now.Version).Set(1)
		e := p.Log.Info().Str("engine", now.Engine).Str("version", now.Version)
		if old != (engineinfo.Info{}) {
			e = e.Str("was", old.Engine+" "+old.Version)
		}
		e.Msg("local engine version")
	})
}

// EngineInfo is the local engine's kind and version as it last answered
// (zero until it did).
func (p *Proxy) EngineInfo() engineinfo.Info {
	if p.engine == nil {
		return engineinfo.Info{}
	}
	return p.engine.Current()
}
