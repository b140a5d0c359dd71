package enginesim

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestMMItemsOf(t *testing.T) {
	raw := json.RawMessage(`[{"role":"system","content":"s"},{"role":"user","content":[{"type":"text","text":"a"},
		{"type":"image_url","image_url":{"url":"u1"}},{"type":"input_audio","input_audio":{"data":"AAAA","format":"wav"}},
		{"type":"video_url","video_url":{"url":"v"}},{"type":"file","file":{}}]}]`)
	assert.Equal(t, []mmItem{{"image_url", "u1"}, {"input_audio", "AAAA"}, {"video_url", "v"}}, mmItemsOf(raw))
	assert.Empty(t, mmItemsOf(json.RawMessage(`"not a list"`)))
}

// TestEncodingOf: an item's hash and encoding are functions of its type
// and source alone, and differ between items.
func TestEncodingOf(t *testing.T) {
	a, b := mmItem{"image_url", "u1"}, mmItem{"image_url", "u2"}
	assert.Equal(t, encodingOf(a), encodingOf(mmItem{"image_url", "u1"}))
	assert.NotEqual(t, encodingOf(a), encodingOf(b))
	assert.NotEqual(t, encodingOf(a), encodingOf(mmItem{"video_url", "u1"}))
	assert.Len(t, a.hash(), 16)
	assert.Len(t, Tokenize(encodingOf(a)), 4)
}

func TestParseECParams(t *testing.T) {
	got := parseECParams(json.RawMessage(`{"h1":{"metadata":{},"peer_host":"127.0.0.1","peer_port":9,"size_bytes":12,"shape":[1,12]},
		"h2":{"metadata":{}},"h3":"nope","h4":{"peer_host":"h","size_bytes":1},"h5":{"peer_host":"127.0.0.1","peer_port":9}}`))
	size := 12
	assert.Equal(t, map[string]ecRef{"h1": {PeerHost: "127.0.0.1", PeerPort: 9, SizeBytes: &size}}, got, "unusable entries are ignored")
	assert.Nil(t, parseECParams(nil))
	assert.Nil(t, parseECParams(json.RawMessage(`[1]`)))
}
