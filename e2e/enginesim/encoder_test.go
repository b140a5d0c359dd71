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
	got := parseECParams(json.RawMessage(`{"h1":{"handle":"x","remote_host":"127.0.0.1","remote_port":9},
		"h2":{"handle":"","remote_host":"127.0.0.1","remote_port":9},"h3":"nope","h4":{"handle":"y","remote_host":"h"}}`))
	assert.Equal(t, map[string]ecRef{"h1": {Handle: "x", RemoteHost: "127.0.0.1", RemotePort: 9}}, got, "unusable entries are ignored")
	assert.Nil(t, parseECParams(nil))
	assert.Nil(t, parseECParams(json.RawMessage(`[1]`)))
}
