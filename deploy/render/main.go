// Command render prints the pd-sidecar Helm chart rendered with the given
// values files, as `helm template` would, with no helm binary: the Helm Go
// SDK the chart's tests use renders it, and values are checked against the
// chart's values.schema.json. `make render VALUES=my-values.yaml`.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"helm.sh/helm/v4/pkg/chart/common"
	"helm.sh/helm/v4/pkg/chart/common/util"

	"github.com/pd-sidecar/pd-sidecar/deploy/rendertest"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// valueFiles collects repeated -f flags.
type valueFiles []string

func (v *valueFiles) String() string     { return strings.Join(*v, ",") }
func (v *valueFiles) Set(s string) error { *v = append(*v, s); return nil }

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("render", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var files valueFiles
	fs.Var(&files, "f", "a values file (repeatable; later files win)")
	chart := fs.String("chart", "deploy/helm/pd-sidecar", "the chart's directory")
	name := fs.String("name", "pd", "release name")
	namespace := fs.String("namespace", "default", "release namespace")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	values := map[string]any{}
	for _, f := range files {
		v, err := common.ReadValuesFile(f)
		if err != nil {
			fmt.Fprintf(stderr, "render: %v\n", err)
			return 2
		}
		values = util.MergeTables(v, values)
	}
	out, err := rendertest.RenderYAML(*chart, *name, *namespace, values)
	if err != nil {
		fmt.Fprintf(stderr, "render: %v\n", err)
		return 1
	}
	if _, err := stdout.Write(out); err != nil {
		return 1
	}
	return 0
}
