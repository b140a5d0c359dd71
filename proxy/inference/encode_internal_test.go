package inference

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/failure"
	"github.com/pd-sidecar/pd-sidecar/proxy/core"
	"github.com/pd-sidecar/pd-sidecar/proxy/encoder"
)

// TestEncoderErrorsClassified: every encoder-stage failure is answered
// 502, but one wrapping a client body no leg can be built of (400).
func TestEncoderErrorsClassified(t *testing.T) {
	for _, tc := range []struct {
		err    error
		status int
	}{
		{encoder.ErrNoneAllowed, 502},
		{fmt.Errorf("%w for item 1: %w", encoder.ErrFailed, encoder.ErrTimeout), 502},
		{fmt.Errorf("%w for item 0: %w", encoder.ErrFailed, fmt.Errorf("%w: %w", core.ErrBadRequest, connectors.ErrBadBody)), 400},
	} {
		assert.Equal(t, tc.status, failure.Of(tc.err).Status, "%v", tc.err)
	}
}
