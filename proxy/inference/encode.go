package inference

import (
	"github.com/pd-sidecar/pd-sidecar/proxy/core"
	"github.com/pd-sidecar/pd-sidecar/proxy/encoder"
	"github.com/pd-sidecar/pd-sidecar/proxy/tlsconf"
	"github.com/pd-sidecar/pd-sidecar/proxy/upstream"
)

// newEncoderTransport is the encoder legs' transport, with TLS when the
// stage asks for it; nil when the stage is off.
func newEncoderTransport(cfg core.Config) (*upstream.Transport, error) {
	e := cfg.Encoder
	if e.Connector == "" {
		return nil, nil
	}
	t := upstream.NewTransport(cfg.ConnectTimeout, cfg.MaxConnsPerHost, e.MaxEncoders)
	t.SetAnswerLimits(cfg.MaxUpstreamAnswerBytes, cfg.Guard.MaxHeaderBytes)
	if e.TLS {
		// Every encoder address gets the "prefiller" config of this one.
		tc := tlsconf.Config{Prefiller: true, InsecureSkipVerifyPrefiller: e.InsecureSkipVerify, CAFile: cfg.Guard.TLS.CAFile}
		f, err := tc.Upstream(nil)
		if err != nil {
			return nil, err
		}
		t.UseTLS(f)
	}
	return t, nil
}

// newEncoderStage returns the encoder stage of p, through its encoder
// transport, with its SSRF checks; nil when the stage is off.
func newEncoderStage(p *Proxy) *encoder.Stage {
	if p.EncTr == nil {
		return nil
	}
	return encoder.New(encoder.Deps{
		Config:      p.Cfg.Encoder,
		Transport:   p.EncTr,
		Allowlist:   p.Cfg.Guard.Allowlist,
		RefusedAddr: p.RefusedAddr,
		BadRequest:  core.ErrBadRequest,
		Metrics:     p.M.Encoder,
	})
}
