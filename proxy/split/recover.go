package split

import "errors"

// Recoverable marks err, the failure of the leg that was to answer a
// split request, as one a local prefill may serve instead: the decode
// engine failed to load the KV and --on-kv-load-failure re-runs the
// request, or the step that gets the KV to it failed in a way that leaves
// the local engine able to serve it. The code that defines such a
// failure marks it; the machines decide what it degrades to. err stays
// what it was for errors.Is and errors.As.
func Recoverable(err error) error {
	if err == nil {
		return nil
	}
	return recoverable{err}
}

// Recovers reports whether err was marked Recoverable: a failure for the
// split to decide on, not one to answer as it is.
func Recovers(err error) bool {
	var r recoverable
	return errors.As(err, &r)
}

type recoverable struct{ error }

func (r recoverable) Unwrap() error { return r.error }
