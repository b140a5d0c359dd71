package failure_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/pd-sidecar/pd-sidecar/failure"
)

var (
	errGone    = failure.New("gone", failure.Outcome{Status: 499, Precedence: 2})
	errTimeout = failure.New("timeout", failure.Outcome{Status: 504, Reason: "timeout"})
	errServer  = failure.New("5xx", failure.Outcome{Status: 502, Reason: "server_error", Retry: true})
	errPlain   = errors.New("plain")
	errForeign = errors.New("foreign")
)

func foreign(err error) (failure.Outcome, bool) {
	if err == errForeign {
		return failure.Outcome{Status: 503, Reason: "foreign", Precedence: 1}, true
	}
	return failure.Outcome{}, false
}

func TestOf(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want failure.Outcome
	}{
		{"none", errPlain, failure.Default},
		{"nil", nil, failure.Default},
		{"itself", errTimeout, errTimeout.Outcome()},
		{"wrapped", fmt.Errorf("x: %w", errServer), errServer.Outcome()},
		{"the outermost of equals", fmt.Errorf("%w (after %w)", errTimeout, errServer), errTimeout.Outcome()},
		{"inside one without", fmt.Errorf("%w: %w", errPlain, errServer), errServer.Outcome()},
		{"precedence wins from inside", fmt.Errorf("%w: %w", errTimeout, fmt.Errorf("y: %w", errGone)), errGone.Outcome()},
		{"foreign", fmt.Errorf("%w: %w", errServer, errForeign), foreign2(t)},
		{"higher precedence over foreign", errors.Join(errForeign, errGone), errGone.Outcome()},
		{"joined: the first of equals", errors.Join(errServer, errTimeout), errServer.Outcome()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, failure.Of(tt.err, foreign))
		})
	}
	assert.Equal(t, errTimeout.Outcome(), failure.Of(fmt.Errorf("%w: %w", errTimeout, errForeign), nil), "no foreign outcomes")
}

func foreign2(t *testing.T) failure.Outcome {
	t.Helper()
	o, ok := foreign(errForeign)
	assert.True(t, ok)
	return o
}
