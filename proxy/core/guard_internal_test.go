package core

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/pd-sidecar/pd-sidecar/circuit"
	"github.com/pd-sidecar/pd-sidecar/failure"
	"github.com/pd-sidecar/pd-sidecar/proxy/guard"
	"github.com/pd-sidecar/pd-sidecar/proxy/split"
)

func TestClassifyGuards(t *testing.T) {
	assert.Equal(t, failure.Outcome{Status: 403, Precedence: failure.PrecedenceDenied}, failure.Of(fmt.Errorf("%w: x", guard.ErrPrefillerDenied)))
	assert.Equal(t, failure.Outcome{Status: 503, Reason: failure.ReasonCircuitOpen, Precedence: failure.PrecedenceCircuitOpen}, failure.Of(fmt.Errorf("%w: x", guard.ErrCircuitOpen)))
	assert.Equal(t, circuit.Failure, breakerResult(fmt.Errorf("%w: x", split.ErrPrefillTimeout)))
	assert.Equal(t, circuit.Unreachable, breakerResult(fmt.Errorf("%w: x", ErrPrefillUnreachable)))
	assert.Equal(t, circuit.Failure, breakerResult(fmt.Errorf("%w: x", ErrPrefillServerError)))
	assert.Equal(t, circuit.Neutral, breakerResult(ErrClientGone))
	assert.Equal(t, circuit.Success, breakerResult(ErrPrefillOverloaded))
	assert.Equal(t, circuit.Success, breakerResult(nil))
}
