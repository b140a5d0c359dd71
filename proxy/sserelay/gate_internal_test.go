package sserelay

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd-sidecar/pd-sidecar/connectors"
)

// TestGateDeciding: a decode-first leg's stream is held until an event
// serves (output, or an error the client is to see) or declines the
// request; preamble and data-less events keep it held.
func TestGateDeciding(t *testing.T) {
	const (
		role    = "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\n"
		output  = "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n"
		decline = "data: {\"choices\":[{\"delta\":{\"content\":\"\"},\"finish_reason\":\"cache_threshold\"}]}\n\n"
		errEv   = "data: {\"error\":{\"message\":\"boom\",\"code\":500}}\n\n"
		comment = ": keep-alive\n\n"
	)
	for _, c := range []struct {
		name   string
		events []string
		want   Gate
		seen   bool
	}{
		{"nothing yet", nil, GateDeciding, false},
		{"preamble only", []string{role, comment}, GateDeciding, true},
		{"output after the preamble", []string{role, output}, GateOutput, true},
		{"declined after the preamble", []string{role, decline}, GateDeclined, true},
		{"declined first", []string{decline, output}, GateDeclined, true},
		{"an error event serves", []string{errEv}, GateOutput, true},
		{"a comment holds", []string{comment, output}, GateOutput, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := Stream{API: connectors.APIChat, Gate: GateDeciding,
				Declines: func(d []byte) bool { return bytes.Contains(d, []byte("cache_threshold")) }}
			var out []byte
			for _, ev := range c.events {
				var err error
				out, err = s.Feed(out, []byte(ev))
				require.NoError(t, err)
			}
			assert.Equal(t, c.want, s.Gate)
			assert.Equal(t, c.seen, s.SawEvents())
			assert.Equal(t, c.want == GateDeciding, s.Gate.Shut())
		})
	}
}
