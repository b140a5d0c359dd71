package main

import (
	"io"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd-sidecar/pd-sidecar/deploy/rendertest/modelservice"
)

// TestModelserviceFixtureArgsParse feeds every argument list llm-d's
// modelservice chart rendered (deploy/rendertest/testdata/
// llm-d-modelservice.json: each routing.proxy key on and off, both
// connectors) to the parser unchanged, and checks that the arguments mean
// what they mean in llm-d.
func TestModelserviceFixtureArgsParse(t *testing.T) {
	f, err := modelservice.Load()
	require.NoError(t, err)
	lists := f.ArgLists()
	require.Greater(t, len(lists), 10, "the fixture renders many distinct argument lists")
	for _, l := range lists {
		t.Run(strings.Join(l.Args, " "), func(t *testing.T) {
			o, err := parseFlags(l.Args, io.Discard)
			require.NoError(t, err, "cases %v", l.Cases)
			val := map[string]string{}
			for _, a := range l.Args {
				k, v, _ := strings.Cut(a, "=")
				val[k] = v
			}
			assert.Equal(t, val["--port"], strconv.Itoa(o.cfg.Port))
			assert.Equal(t, val["--vllm-port"], strconv.Itoa(o.cfg.ModelServerPort))
			assert.Equal(t, val["--secure-proxy"] == "true", o.cfg.Guard.TLS.SecureProxy)
			assert.Equal(t, val["--cert-path"], o.cfg.Guard.TLS.CertPath)
			assert.Equal(t, val["--prefiller-use-tls"] == "true", o.cfg.Guard.TLS.Prefiller)
		})
	}
}
