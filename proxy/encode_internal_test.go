package proxy

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/metrics"
)

// TestScanRequestEncoders: x-encoder-hosts-ports (as long as
// x-prefiller-host-port) is seen in any letter case, without taking the
// prefiller's place, and a leg's head never carries it.
func TestScanRequestEncoders(t *testing.T) {
	for _, tc := range []struct {
		name, headers string
		encoders      bool
		prefiller     string
	}{
		{"none", "Content-Type: application/json\r\n", false, ""},
		{"encoders, any case", "X-Encoder-HOSTS-Ports: 10.0.0.1:8000\r\n", true, ""},
		{"encoders and prefiller", "x-encoder-hosts-ports: e:1\r\nx-prefiller-host-port: p:2\r\n", true, "p:2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := parseRequestHead(t, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"+tc.headers+"Content-Length: 2\r\n\r\n")
			lr := scanRequest(h)
			assert.Equal(t, tc.encoders, lr.encoders)
			assert.False(t, lr.refused, "refused only while the stage is on (the caller's check)")
			assert.Equal(t, tc.prefiller, string(lr.prefiller))
			assert.NotContains(t, strings.ToLower(string(appendLegHead(nil, h, "127.0.0.1:1", "rid", 2))), HeaderEncoders)
		})
	}
}

func TestEncoderConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*EncoderConfig)
		want string
	}{
		{"defaults", func(*EncoderConfig) {}, ""},
		{"ec-nixl", func(c *EncoderConfig) { c.Connector = connectors.ECNixl }, ""},
		{"unknown connector", func(c *EncoderConfig) { c.Connector = "ec-x" }, "--ec-connector"},
		{"timeout", func(c *EncoderConfig) { c.Timeout = 0 }, "--encoder-timeout"},
		{"concurrency", func(c *EncoderConfig) { c.MaxConcurrency = 0 }, "--encoder-max-concurrency"},
		{"failure policy", func(c *EncoderConfig) { c.OnFailure = "retry" }, "--on-encoder-failure"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultEncoderConfig()
			tc.edit(&c)
			err := c.Validate()
			if tc.want == "" {
				assert.NoError(t, err)
				return
			}
			assert.ErrorContains(t, err, tc.want)
		})
	}
}

// TestEncoderReason: every encoder-leg error maps to one reason label of
// the closed set, and a leg cancelled by another's failure to none; every
// stage failure is answered 502.
func TestEncoderReason(t *testing.T) {
	for _, tc := range []struct {
		err    error
		reason string
	}{
		{ErrEncoderTimeout, metrics.EncoderTimeout},
		{fmt.Errorf("%w: %w 500: x", ErrEncoderFailed, errEncoderStatus), metrics.EncoderStatus},
		{fmt.Errorf("%w: %w", ErrEncoderFailed, errEncoderBadAnswer), metrics.EncoderBadAnswer},
		{fmt.Errorf("%w: %w", ErrEncoderFailed, context.Canceled), metrics.EncoderUnreachable},
		{errCancelledByFailure, ""},
		{ErrClientGone, ""},
	} {
		assert.Equal(t, tc.reason, encoderReason(tc.err), "%v", tc.err)
	}
	for _, err := range []error{ErrEncoderTimeout, ErrNoEncoder, fmt.Errorf("encoder request failed for item 1: %w", errCancelledByFailure)} {
		assert.Equal(t, 502, classify(err).status, "%v", err)
	}
}
