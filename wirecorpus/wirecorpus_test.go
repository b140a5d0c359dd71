package wirecorpus_test

import (
	"encoding/json"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd-sidecar/pd-sidecar/wirecorpus"
)

var (
	commit = regexp.MustCompile(`^[0-9a-f]{40}$`)
	name   = regexp.MustCompile(`^[a-z0-9]+(-[a-z0-9]+)*$`)
)

// TestCorpusShapesAreWhole: every shape names its source (a commit, or
// notes that say why none), is a JSON object, and reads only members it
// has.
func TestCorpusShapesAreWhole(t *testing.T) {
	all, err := wirecorpus.All()
	require.NoError(t, err)
	require.NotEmpty(t, all)
	connectors := []string{"nixlv2", "mooncake", "sglang", "ec-nixl", "moriio", "offloading", "sidecar", "shared-storage", wirecorpus.AnyConnector}
	messages := []string{wirecorpus.PrefillAnswer, wirecorpus.DecodeAnswer, wirecorpus.BootstrapAnswer, wirecorpus.EncoderAnswer, wirecorpus.PrefillRequest, wirecorpus.DecodeRequest, wirecorpus.ClientRequest, wirecorpus.ErrorAnswer}
	for _, s := range all {
		t.Run(s.Name, func(t *testing.T) {
			assert.Regexp(t, name, s.Name)
			assert.Contains(t, connectors, s.Connector)
			assert.Contains(t, messages, s.Message)
			assert.NotEmpty(t, s.Engine)
			assert.NotEmpty(t, s.Generation)
			assert.NotEmpty(t, s.Source.Repository)
			assert.NotEmpty(t, s.Source.File)
			if s.Source.Commit == "" {
				assert.Contains(t, s.Notes, "ommit", "a shape without a commit says why in its notes")
			} else {
				assert.Regexp(t, commit, s.Source.Commit)
			}
			var v map[string]json.RawMessage
			require.NoError(t, json.Unmarshal(s.Value, &v), "the value is a JSON object")
			members := s.Members()
			assert.Len(t, members, len(v), "no member twice")
			for _, m := range s.DecodeReads.Requires {
				assert.Contains(t, s.DecodeReads.Members, m, "a required member is read")
			}
			// A member read with a default may be absent; one required
			// is in the value (but for paths under keys, "<dp_rank>.x").
			for _, m := range s.DecodeReads.Requires {
				assert.True(t, slices.Contains(members, strings.Split(m, ".")[0]) || strings.Contains(m, "<"), "required member %q is in the value", m)
			}
			b := s.Body(`"id":"x"`)
			assert.True(t, json.Valid(b), "%s", b)
			if s.Message == wirecorpus.ClientRequest {
				d := s.Decoder
				require.NotNil(t, d, "a client request says how its engine decodes it")
				assert.Contains(t, []string{"first", "last"}, d.RepeatedName)
				assert.Contains(t, []string{"exact", "fold"}, d.NameCase)
				assert.Contains(t, []string{"kept", "replaced", "refused"}, d.LoneSurrogate)
				assert.Contains(t, []string{"strict", "lax"}, d.Booleans)
				assert.NotEmpty(t, d.Source.Repository)
				assert.NotEmpty(t, d.Source.File)
				assert.True(t, d.Source.Commit != "" || d.Source.Release != "", "the decoder's source names a commit or a release")
			}
			if s.Message == wirecorpus.ErrorAnswer {
				assert.GreaterOrEqual(t, s.Status, 400, "an error answer says its status")
				var e struct {
					Error struct {
						Message string `json:"message"`
						Type    string `json:"type"`
						Code    int    `json:"code"`
					} `json:"error"`
				}
				require.NoError(t, json.Unmarshal(s.Value, &e))
				assert.NotEmpty(t, e.Error.Message)
				assert.NotEmpty(t, e.Error.Type)
				assert.Equal(t, s.Status, e.Error.Code, "vLLM's error code is the answer's status")
			} else {
				assert.Zero(t, s.Status, "only an error answer has a status")
			}
		})
	}
}

func TestGenerationNamesAShapeByItsMembers(t *testing.T) {
	s, err := wirecorpus.Get("vllm-nixl-pull-0050936b")
	require.NoError(t, err)
	m := s.Members()
	slices.Reverse(m)
	assert.Equal(t, s.Name, wirecorpus.Generation("nixlv2", wirecorpus.PrefillAnswer, m))
	assert.Empty(t, wirecorpus.Generation("nixlv2", wirecorpus.PrefillAnswer, append(m, "new_member")))
}
