package connectors

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd-sidecar/pd-sidecar/wirecorpus"
)

// TestOneParseFollowsTheCorpus: for each engine's request reading in the
// upstream corpus, the body as the engine takes it passes, every member it
// reads is one the case rule covers, and each form its decoder reads
// otherwise than the sidecar (gjson: the first of a repeated name, names
// exact, a lone surrogate as U+FFFD, booleans only true and false) is
// refused as ambiguous.
func TestOneParseFollowsTheCorpus(t *testing.T) {
	all, err := wirecorpus.All()
	require.NoError(t, err)
	n := 0
	for _, s := range all {
		if s.Message != wirecorpus.ClientRequest {
			continue
		}
		n++
		t.Run(s.Name, func(t *testing.T) {
			body := string(s.Body(""))
			_, err := ScanBody(APIChat, []byte(body))
			require.NoError(t, err, "the request as the engine takes it passes")
			for _, m := range s.DecodeReads.Members {
				assert.Contains(t, readNames, m, "a member %s reads is a read name (its case variants refused)", s.Engine)
			}
			d := s.Decoder
			var differ []string
			if d.RepeatedName != "first" {
				differ = append(differ, `{"messages":[{"role":"user","content":"a","content":"b"}]}`)
			}
			if d.NameCase == "fold" {
				differ = append(differ, `{"messages":[{"role":"user","Content":"b"}]}`, `{"messages":[],"Stream":true}`)
			}
			if d.LoneSurrogate != "replaced" {
				differ = append(differ, `{"messages":[{"role":"user","content":"\ud800"}]}`)
			}
			if d.Booleans == "lax" {
				differ = append(differ, `{"messages":[],"stream":"yes"}`, `{"messages":[],"stream":1}`)
			}
			require.NotEmpty(t, differ, "an engine that reads as gjson does needs no rule: say so")
			for _, b := range differ {
				_, err := ScanBody(APIChat, []byte(b))
				assert.ErrorIs(t, err, ErrAmbiguousJSON, "%s reads %s otherwise", s.Engine, strings.TrimSpace(b))
			}
		})
	}
	assert.GreaterOrEqual(t, n, 2, "the corpus holds the request readings of vLLM and a Go engine")
}
