package connectors

import (
	"encoding/json"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
)

// appendQuoted writes printable ASCII as JSON reads it back, and anything
// else as strconv.AppendQuote does.
func TestAppendQuoted(t *testing.T) {
	for _, s := range []string{"", "remote_host", "10.0.0.9", "a b~!", `q"uote`, `back\slash`, "tab\there", "\x00", "é", "\x7f"} {
		got := appendQuoted([]byte("x"), s)
		assert.Equal(t, "x"+strconv.Quote(s), string(got))
		var back string
		if printableASCII(s) && assert.NoError(t, json.Unmarshal(got[1:], &back), "%q", got) {
			assert.Equal(t, s, back)
		}
	}
}

func printableASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}
