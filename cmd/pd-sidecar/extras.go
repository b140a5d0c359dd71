package main

import (
	"context"
	"io"
	"time"

	"github.com/pd-sidecar/pd-sidecar/proxy"
	"github.com/pd-sidecar/pd-sidecar/proxy/inference"
	"github.com/pd-sidecar/pd-sidecar/status"
)

// installExtras wires the proxy's optional collaborators: the /debug/pd
// tracker, always; OpenTelemetry spans when tracing is on (console spans go
// to stdout). The returned func flushes what must be flushed at exit.
func installExtras(p *proxy.Proxy, opts options, connector string, tracing tracingSetup, stdout io.Writer) (func(), error) {
	handoff := "engine-pull"
	if connector == "sidecar" {
		handoff = "sidecar-pull"
	}
	tr := status.New(status.Options{
		Connector:     connector,
		Transport:     handoff,
		MaxPrefillers: opts.cfg.MaxPrefillers,
		Circuits:      p,
		Wire:          p,
	})
	ext := inference.Extras{Observer: tr, Debug: tr.ServeDebug}
	shutdown := func() {}
	if tracing.on() {
		tracer, prop, stop, err := newTracing(context.Background(), tracing, stdout)
		if err != nil {
			return nil, err
		}
		ext.Tracer, ext.Propagator = tracer, prop
		shutdown = func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = stop(ctx)
		}
	}
	p.SetExtras(ext)
	return shutdown, nil
}
