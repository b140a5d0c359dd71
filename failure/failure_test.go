package failure_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/pd-sidecar/pd-sidecar/failure"
)

var (
	errGone    = failure.New("gone", failure.Outcome{Status: 499, Precedence: failure.PrecedenceClientGone})
	errDenied  = failure.New("denied", failure.Outcome{Status: 403, Precedence: failure.PrecedenceDenied})
	errOpen    = failure.New("open", failure.Outcome{Status: 503, Reason: failure.ReasonCircuitOpen, Precedence: failure.PrecedenceCircuitOpen})
	errBudget  = failure.New("budget", failure.Outcome{Status: 503, Reason: failure.ReasonBufferBudget, RetryAfter: true, Precedence: failure.PrecedenceBufferBudget})
	errTimeout = failure.New("timeout", failure.Outcome{Status: 504, Reason: failure.ReasonTimeout})
	errServer  = failure.New("5xx", failure.Outcome{Status: 502, Reason: failure.ReasonServerError, Retry: true})
	errPlain   = errors.New("plain")
)

func TestOf(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want failure.Outcome
	}{
		{"none", errPlain, failure.Default},
		{"nil", nil, failure.Default},
		{"wrapped none", fmt.Errorf("x: %w", errPlain), failure.Default},
		{"joined none", errors.Join(errPlain, errors.New("other")), failure.Default},
		{"itself", errTimeout, errTimeout.Outcome()},
		{"wrapped", fmt.Errorf("x: %w", errServer), errServer.Outcome()},
		{"wrapped twice", fmt.Errorf("y: %w", fmt.Errorf("x: %w", errServer)), errServer.Outcome()},
		{"the outermost of equals", fmt.Errorf("%w (after %w)", errTimeout, errServer), errTimeout.Outcome()},
		{"the outer of equals wrapped in each other", fmt.Errorf("%w: %w", errServer, fmt.Errorf("y: %w", errTimeout)), errServer.Outcome()},
		{"inside one without", fmt.Errorf("%w: %w", errPlain, errServer), errServer.Outcome()},
		{"precedence wins from inside", fmt.Errorf("%w: %w", errTimeout, fmt.Errorf("y: %w", errGone)), errGone.Outcome()},
		{"precedence over none", fmt.Errorf("%w: %w", errServer, errBudget), errBudget.Outcome()},
		{"joined: the first of equals", errors.Join(errServer, errTimeout), errServer.Outcome()},
		{"joined: precedence wins from the last", errors.Join(errServer, errPlain, errDenied), errDenied.Outcome()},
		{"joined inside a wrap", fmt.Errorf("x: %w", errors.Join(errPlain, errTimeout)), errTimeout.Outcome()},
		{"wrapped inside a join", errors.Join(errPlain, fmt.Errorf("y: %w", errBudget)), errBudget.Outcome()},
		{"circuit open over budget", fmt.Errorf("%w: %w", errBudget, errOpen), errOpen.Outcome()},
		{"denied over circuit open", errors.Join(errOpen, errDenied), errDenied.Outcome()},
		{"client gone over all", fmt.Errorf("%w: %w", errors.Join(errDenied, errOpen, errBudget), errGone), errGone.Outcome()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, failure.Of(tt.err))
		})
	}
}

// The precedences keep their order: a refusal for want of buffer room,
// a circuit open, a denial, a client gone.
func TestPrecedenceOrder(t *testing.T) {
	assert.Less(t, 0, failure.PrecedenceBufferBudget)
	assert.Less(t, failure.PrecedenceBufferBudget, failure.PrecedenceCircuitOpen)
	assert.Less(t, failure.PrecedenceCircuitOpen, failure.PrecedenceDenied)
	assert.Less(t, failure.PrecedenceDenied, failure.PrecedenceClientGone)
}
