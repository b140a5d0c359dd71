package main

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/spf13/pflag"

	"github.com/pd-sidecar/pd-sidecar/connectors/mooncake"
	"github.com/pd-sidecar/pd-sidecar/connectors/nixlv2"
	"github.com/pd-sidecar/pd-sidecar/connectors/offloading"
	"github.com/pd-sidecar/pd-sidecar/connectors/sglang"
	"github.com/pd-sidecar/pd-sidecar/connectors/sharedstorage"
	"github.com/pd-sidecar/pd-sidecar/connectors/sidecar"
)

// connectorNames lists the --kv-connector values registered in connector.
var connectorNames = strings.Join([]string{nixlv2.Name, sglang.Name, mooncake.Name, sharedstorage.Name, offloading.Name, sidecar.Name}, ", ")

// connectorOptions configure the connectors.
type connectorOptions struct {
	sglangBootstrapPort   int
	mooncakeBootstrapPort int
}

// addConnectorFlags declares the connectors' flags on fs. The SGLang
// bootstrap port defaults to $SGLANG_BOOTSTRAP_PORT when set (llm-d reads
// the same variable), else 8998; a value that is not a port is refused
// (stricter than llm-d). The Mooncake bootstrap port defaults to
// $MOONCAKE_BOOTSTRAP_PORT, ignored unless an integer, as in llm-d.
// getenv reads the environment.
func addConnectorFlags(fs *pflag.FlagSet, o *connectorOptions, getenv func(string) string) error {
	sg := sglang.DefaultBootstrapPort
	if v := getenv("SGLANG_BOOTSTRAP_PORT"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 || n > 65535 {
			return fmt.Errorf("SGLANG_BOOTSTRAP_PORT %q is not a port", v)
		}
		sg = n
	}
	fs.IntVar(&o.sglangBootstrapPort, "sglang-bootstrap-port", sg, "SGLang prefillers' bootstrap port, sent as bootstrap_port (env SGLANG_BOOTSTRAP_PORT)")
	fs.IntVar(&o.mooncakeBootstrapPort, "mooncake-bootstrap-port", envPort(getenv, "MOONCAKE_BOOTSTRAP_PORT", mooncake.DefaultBootstrapPort), "Mooncake prefillers' bootstrap port, queried with GET /query (env MOONCAKE_BOOTSTRAP_PORT)")
	return nil
}

// validate reports an invalid connector option, as one line.
func (o connectorOptions) validate() error {
	for _, f := range []struct {
		name string
		port int
	}{{"--sglang-bootstrap-port", o.sglangBootstrapPort}, {"--mooncake-bootstrap-port", o.mooncakeBootstrapPort}} {
		if f.port <= 0 || f.port > 65535 {
			return fmt.Errorf("%s %d is not a port", f.name, f.port)
		}
	}
	return nil
}
