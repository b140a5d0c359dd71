//go:build ucx

package ucx

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestLocalTLS(t *testing.T) {
	for tls, want := range map[string]string{
		"all":              "posix,sysv",
		"":                 "",
		"sm,tcp,self":      "posix,sysv",
		"sm,self":          "posix,sysv",
		"shm,cma,self":     "posix,sysv",
		"posix,sysv,rc,ud": "posix,sysv",
		"posix,self":       "posix",
		"tcp,cma":          "",
		"cma,self":         "",
		"tcp":              "",
		"rc_x,dc_x":        "",
		"^tcp":             "posix,sysv",
		"^sysv,tcp":        "posix",
		"^sm":              "",
		" sm , tcp ":       "posix,sysv",
	} {
		assert.Equal(t, want, localTLS(tls), "UCX_TLS=%q", tls)
	}
}
