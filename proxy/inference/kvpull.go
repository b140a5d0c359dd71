package inference

import (
	"context"
	"errors"
	"fmt"

	"github.com/valyala/fasthttp"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/kvtransfer"
	"github.com/pd-sidecar/pd-sidecar/proxy/feature"
	"github.com/pd-sidecar/pd-sidecar/proxy/kvpull"
	"github.com/pd-sidecar/pd-sidecar/proxy/split"
	"github.com/pd-sidecar/pd-sidecar/proxy/upstream"
)

// The sidecar-driven KV pull (--kv-connector sidecar) is kvpull.Puller's:
// between the prefill answer and the decode leg, the proxy borrows blocks
// of the local engine, pulls the prefiller's KV into them and names them
// in the decode leg. What is bound to a request stays here: the check of
// the addresses its handoff names, its calls to its local engine, and what
// a failed pull becomes for it.

// KVPull is the step that pulls the KV the handoff h names into blocks
// borrowed from the local engine (the pull's transports block); done goes
// on with the decode leg's handoff naming them, or with what the pull's
// failure is to the split (KVPullFailure).
func (r *Request) KVPull(h connectors.Handoff, done func(connectors.Handoff, error)) feature.Step {
	return func(ctx context.Context) func() {
		pulled, err := pullKV(ctx, r, h)
		return func() {
			if err != nil {
				err = KVPullFailure(r, err)
			}
			done(pulled, err)
		}
	}
}

// pullKV pulls the handoff's KV into blocks borrowed from the local engine
// and returns the decode leg's handoff naming them (kvpull.Puller.Pull).
func pullKV(ctx context.Context, r *Request, h connectors.Handoff) (connectors.Handoff, error) {
	// The agent is dialed by the pull: its address is checked here too,
	// whatever read the handoff (PrefillAnswered did already).
	if err := r.P.addrsAllowed(r.Prefiller, h.Addrs); err != nil {
		return h, err
	}
	return r.P.KV.Pull(ctx, kvpull.Request{
		ID: r.ID, Label: r.Label, Local: r.Local,
		Call: func(ctx context.Context, path string, body []byte) ([]byte, int, error) {
			return engineCall(ctx, r, path, body)
		},
		CallErr: func(err error) error { return upstreamErr(upstream.RoleEngine, r.Local, err) },
		Log:     r.LogAt,
	}, h)
}

// engineCall POSTs a JSON body to the local engine.
func engineCall(ctx context.Context, r *Request, path string, body []byte) ([]byte, int, error) {
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.Header.SetMethod(fasthttp.MethodPost)
	req.Header.SetRequestURI(path)
	req.Header.SetHost(r.Local)
	req.Header.SetContentType("application/json")
	req.Header.Set(HeaderRequestID, r.ID)
	req.SetBodyRaw(body)
	hold, err := r.P.Tr.Do(ctx, r.Local, req, resp)
	defer hold.Release() // resp is let go on return; the copy returned is small JSON
	if err != nil {
		return nil, 0, err
	}
	return append([]byte(nil), resp.Body()...), resp.StatusCode(), nil
}

// KVPullFailure says what a failed pull becomes, marked Recoverable when a
// local prefill may serve the request instead: a client that left is only
// that; a KV agent that is gone, or a descriptor that is refused, is the
// prefiller's fault and degrades; any other failure is a KV load failure,
// re-run locally as --on-kv-load-failure says.
func KVPullFailure(r *Request, err error) error {
	var ue *upstream.UpstreamError
	if !errors.As(err, &ue) && !errors.Is(err, connectors.ErrInvalidKVParams) {
		// The agent's errors may quote its descriptor: said in fixed words.
		err = &upstream.UpstreamError{Role: upstream.RoleKVAgent, Reason: "KV pull failed (" + kvpull.FailureReason(err) + ")", Err: err}
	}
	switch {
	case r.Gone():
		return fmt.Errorf("%w: %w", ErrClientGone, err)
	case errors.Is(err, kvtransfer.ErrKVSourceGone), errors.Is(err, connectors.ErrInvalidKVParams):
		return split.Recoverable(err)
	}
	err = fmt.Errorf("%w: sidecar pull: %w", ErrKVLoadFailed, err)
	if !r.kvLoadRerun() {
		return err
	}
	return split.Recoverable(err)
}
