package kvpull

import (
	"context"
	"errors"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/kvtransfer"
	"github.com/pd-sidecar/pd-sidecar/proxy/feature"
	"github.com/pd-sidecar/pd-sidecar/proxy/upstream"
)

// Feature is the sidecar's KV pull as a request feature: a split's
// handoff, on its way to the decode leg, is a blocking step
// (feature.HandoffStepper) that pulls the KV it names into blocks borrowed
// from the local engine and hands on the decode leg's handoff naming them.
type Feature struct {
	Puller *Puller
	// Allowed checks the addresses a prefiller's handoff names against the
	// allowlist (nil: allowed): the pull dials the agent, so they are
	// checked here too, whatever read the handoff.
	Allowed func(prefiller string, addrs []connectors.Addr) error
	// Call POSTs a JSON body to path on the local engine local, under the
	// request id id: the answer's body and status.
	Call func(ctx context.Context, local, id, path string, body []byte) ([]byte, int, error)
	// CallErr names a failed Call to local as an upstream.UpstreamError of
	// the local engine.
	CallErr func(local string, err error) error
}

// Begin implements feature.Feature: a split's part (none for a request
// that is not split).
func (f Feature) Begin(r feature.Request, _ feature.Head) feature.Use {
	if r.Prefiller == "" || r.Refused {
		return nil
	}
	return &pullUse{f: f, r: r}
}

type pullUse struct {
	f Feature
	r feature.Request
}

// HandoffStep implements feature.HandoffStepper: the pull, whose failure
// is what it is to the split (failureOf).
func (u *pullUse) HandoffStep(h connectors.Handoff, done func(connectors.Handoff, error)) feature.Step {
	return func(ctx context.Context) func() {
		pulled, err := u.pull(ctx, h)
		return func() { done(pulled, failureOf(err)) }
	}
}

func (u *pullUse) pull(ctx context.Context, h connectors.Handoff) (connectors.Handoff, error) {
	r, f := u.r, u.f
	if f.Allowed != nil {
		if err := f.Allowed(r.Prefiller, h.Addrs); err != nil {
			return h, err
		}
	}
	return f.Puller.Pull(ctx, Request{
		ID: r.ID, Label: r.Label, Local: r.Local,
		Call: func(ctx context.Context, path string, body []byte) ([]byte, int, error) {
			return f.Call(ctx, r.Local, r.ID, path, body)
		},
		CallErr: func(err error) error { return f.CallErr(r.Local, err) },
		Log:     r.Log.LogAt,
	}, h)
}

// failureOf says what a failed pull is to the split: a KV agent that is
// gone, or a descriptor that is refused, is the prefiller's fault, which
// falls back to a local prefill; any other failure is the decode engine's
// KV load failure (feature.KVLoadError), which the request judges as
// --on-kv-load-failure says. The agent's errors may quote its descriptor:
// they are said in fixed words.
func failureOf(err error) error {
	if err == nil {
		return nil
	}
	var ue *upstream.UpstreamError
	if !errors.As(err, &ue) && !errors.Is(err, connectors.ErrInvalidKVParams) {
		err = &upstream.UpstreamError{Role: upstream.RoleKVAgent, Reason: "KV pull failed (" + FailureReason(err) + ")", Err: err}
	}
	if errors.Is(err, kvtransfer.ErrKVSourceGone) || errors.Is(err, connectors.ErrInvalidKVParams) {
		return err
	}
	return &feature.KVLoadError{Err: err}
}
