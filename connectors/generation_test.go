package connectors_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/tidwall/gjson"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/wirecorpus"
)

func TestGeneration(t *testing.T) {
	s, err := wirecorpus.Get("vllm-nixl-push-0316d25a")
	if err != nil {
		t.Fatal(err)
	}
	assert.Equal(t, "the upstream shape vllm-nixl-push-0316d25a", connectors.Generation("nixlv2", gjson.ParseBytes(s.Value)))
	got := connectors.Generation("nixlv2", gjson.Parse(`{"do_remote_prefill":true,"new_thing":"10.9.9.9","b\u0061d":1,"x y":2}`))
	assert.Equal(t, "a generation the corpus does not know (members: do_remote_prefill, new_thing, and 2 not plain identifiers)", got)
	assert.NotContains(t, got, "10.9.9.9")
	assert.Equal(t, "not a JSON object", connectors.Generation("nixlv2", gjson.Parse(`[1]`)))
}
