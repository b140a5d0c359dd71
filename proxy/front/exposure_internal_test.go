package front

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestLogPath(t *testing.T) {
	assert.Equal(t, "/v1/models", logPath([]byte("/v1/models")))
	assert.Equal(t, "/a%0D%0Ab%00%25%C3%A9", logPath([]byte("/a\r\nb\x00%é")))
	long := logPath([]byte("/" + strings.Repeat("x", 500)))
	assert.Equal(t, maxLoggedPath+3, len(long))
	assert.True(t, strings.HasSuffix(long, "..."))
}
