package core

import (
	"errors"
	"fmt"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/failure"
	"github.com/pd-sidecar/pd-sidecar/kvtransfer"
	"github.com/pd-sidecar/pd-sidecar/proxy/bootstrap"
	"github.com/pd-sidecar/pd-sidecar/proxy/dprank"
	"github.com/pd-sidecar/pd-sidecar/proxy/guard"
	"github.com/pd-sidecar/pd-sidecar/proxy/split"
	"github.com/pd-sidecar/pd-sidecar/proxy/upstream"
)

// The sentinels of the packages below the proxy carry the outcomes the
// proxy answers them with, alone and wrapped.
func TestSentinelOutcomes(t *testing.T) {
	tests := []struct {
		err  error
		want failure.Outcome
	}{
		{upstream.ErrBufferBudget, failure.Outcome{Status: http.StatusServiceUnavailable, Reason: failure.ReasonBufferBudget, RetryAfter: true, Precedence: failure.PrecedenceBufferBudget}},
		{split.ErrPrefillTimeout, failure.Outcome{Status: http.StatusGatewayTimeout, Reason: failure.ReasonTimeout}},
		{split.ErrKVWaitTimeout, failure.Outcome{Status: http.StatusGatewayTimeout, Reason: failure.ReasonKVWaitTimeout}},
		{split.ErrTPMismatch, failure.Outcome{Status: http.StatusBadGateway, Reason: failure.ReasonTPMismatch}},
		{connectors.ErrNoKVParams, failure.Outcome{Status: http.StatusBadGateway, Reason: failure.ReasonNoKVParams}},
		{connectors.ErrResponsesNoKVParams, failure.Outcome{Status: http.StatusBadGateway, Reason: failure.ReasonNoKVParams}},
		{connectors.ErrInvalidKVParams, failure.Outcome{Status: http.StatusBadGateway, Reason: failure.ReasonInvalidParams}},
		{connectors.ErrBadPrefillAnswer, failure.Outcome{Status: http.StatusBadGateway, Reason: failure.ReasonBadAnswer}},
		{connectors.ErrBadBody, failure.Outcome{Status: http.StatusBadRequest}},
		{connectors.ErrUnsupportedRequest, failure.Outcome{Status: http.StatusBadRequest}},
		{dprank.ErrUnknown, failure.Outcome{Status: http.StatusBadRequest}},
		{connectors.ErrBadBootstrap, failure.Outcome{Status: http.StatusBadGateway, Reason: failure.ReasonBootstrapFailed}},
		{bootstrap.ErrFailed, failure.Outcome{Status: http.StatusBadGateway, Reason: failure.ReasonBootstrapFailed}},
		{kvtransfer.ErrKVSourceGone, failure.Outcome{Status: http.StatusBadGateway, Reason: failure.ReasonKVSourceGone}},
		{guard.ErrPrefillerDenied, failure.Outcome{Status: http.StatusForbidden, Precedence: failure.PrecedenceDenied}},
		{guard.ErrCircuitOpen, failure.Outcome{Status: http.StatusServiceUnavailable, Reason: failure.ReasonCircuitOpen, Precedence: failure.PrecedenceCircuitOpen}},
	}
	for _, tt := range tests {
		t.Run(tt.err.Error(), func(t *testing.T) {
			assert.Equal(t, tt.want, failure.Of(tt.err))
			assert.Equal(t, tt.want, failure.Of(fmt.Errorf("x: %w", tt.err)), "wrapped")
			assert.Equal(t, tt.want, failure.Of(fmt.Errorf("%w: %w", tt.err, errors.New("cause"))), "around an error with none")
		})
	}
}

// The request path's refusals for want of room say Retry-After; a failed
// decode is a 502, as an error with no outcome is.
func TestRequestPathOutcomes(t *testing.T) {
	assert.Equal(t, failure.Outcome{Status: http.StatusServiceUnavailable, RetryAfter: true}, failure.Of(fmt.Errorf("%w (x)", ErrOverloaded)))
	assert.Equal(t, failure.Default, failure.Of(fmt.Errorf("%w: x", ErrDecodeFailed)))
	assert.True(t, failure.Of(fmt.Errorf("%w: %w", ErrPrefillServerError, upstream.ErrBufferBudget)).RetryAfter, "the budget's refusal wins")
	assert.False(t, failure.Of(fmt.Errorf("%w: %w", upstream.ErrBufferBudget, ErrClientGone)).RetryAfter, "a client gone wins")
}
