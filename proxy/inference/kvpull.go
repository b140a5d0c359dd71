package inference

import (
	"context"
	"errors"
	"fmt"

	"github.com/valyala/fasthttp"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/proxy/feature"
	"github.com/pd-sidecar/pd-sidecar/proxy/split"
	"github.com/pd-sidecar/pd-sidecar/proxy/upstream"
)

// HandoffStep is the step a request feature takes the split's handoff h
// with on its way to the decode leg (feature.HandoffStepper: the sidecar's
// own KV pull, --kv-connector sidecar); nil when none does. done goes on
// with the decode leg's handoff, or with what the step's failure is to the
// split (handoffFailure).
func (r *Request) HandoffStep(h connectors.Handoff, done func(connectors.Handoff, error)) feature.Step {
	s := r.uses.HandoffStepper()
	if s == nil {
		return nil
	}
	return s.HandoffStep(h, func(hh connectors.Handoff, err error) {
		if err != nil {
			err = r.handoffFailure(err)
		}
		done(hh, err)
	})
}

// handoffFailure says what the failure of a handoff's step is to the
// split: a client that left is only that; a KV load failure is re-run
// locally, marked Recoverable, as --on-kv-load-failure says, or answered;
// any other (the KV's source gone, its descriptor refused) is the
// prefiller's fault, marked Recoverable to degrade.
func (r *Request) handoffFailure(err error) error {
	var kl *feature.KVLoadError
	load := errors.As(err, &kl)
	switch {
	case r.Gone():
		if load {
			err = kl.Err
		}
		return fmt.Errorf("%w: %w", ErrClientGone, err)
	case !load:
		return split.Recoverable(err)
	}
	err = fmt.Errorf("%w: sidecar pull: %w", ErrKVLoadFailed, kl.Err)
	if !r.kvLoadRerun() {
		return err
	}
	return split.Recoverable(err)
}

// engineCall POSTs a JSON body to path on the local engine local, under
// the request id id: the answer's body and status (kvpull.Feature.Call).
func (p *Proxy) engineCall(ctx context.Context, local, id, path string, body []byte) ([]byte, int, error) {
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.Header.SetMethod(fasthttp.MethodPost)
	req.Header.SetRequestURI(path)
	req.Header.SetHost(local)
	req.Header.SetContentType("application/json")
	req.Header.Set(HeaderRequestID, id)
	req.SetBodyRaw(body)
	hold, err := p.Tr.Do(ctx, local, req, resp)
	defer hold.Release() // resp is let go on return; the copy returned is small JSON
	if err != nil {
		return nil, 0, err
	}
	return append([]byte(nil), resp.Body()...), resp.StatusCode(), nil
}

// engineCallErr names a failed engineCall to local as the local engine's
// upstream failure.
func engineCallErr(local string, err error) error {
	return upstreamErr(upstream.RoleEngine, local, err)
}
