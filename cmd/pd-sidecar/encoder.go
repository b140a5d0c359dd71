package main

import (
	"github.com/spf13/pflag"

	"github.com/pd-sidecar/pd-sidecar/proxy/encoder"
)

// addEncoderFlags declares pd-sidecar's own flags of llm-d's encoder stage
// (--ec-connector itself is llm-d's, in llmd_flags.go), writing into c.
func addEncoderFlags(fs *pflag.FlagSet, c *encoder.Config) {
	fs.DurationVar(&c.Timeout, "encoder-timeout", c.Timeout, "bound on a request's whole encoder fan-out (--ec-connector); past it the unfinished items fail as --on-encoder-failure says")
	fs.IntVar(&c.MaxConcurrency, "encoder-max-concurrency", c.MaxConcurrency, "encoder legs of one request in flight at once (--ec-connector)")
	fs.StringVar(&c.OnFailure, "on-encoder-failure", c.OnFailure, "when an encoder leg fails or all named encoders are refused: error (502, as llm-d) or local (send the request on without that item's encoder output; the prefill/decode engine encodes it itself)")
}
