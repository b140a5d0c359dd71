// Command schemagen writes the pd-sidecar chart's values.schema.json from
// its values.yaml and the `pd-sidecar --help` text read on stdin (see
// rendertest.ValuesSchema): `make schema`.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"

	"sigs.k8s.io/yaml"

	"github.com/pd-sidecar/pd-sidecar/deploy/rendertest"
)

func main() {
	values := flag.String("values", "deploy/helm/pd-sidecar/values.yaml", "the chart's default values")
	flag.Parse()
	if err := run(*values, os.Stdin, os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "schemagen: %v\n", err)
		os.Exit(1)
	}
}

func run(valuesPath string, help io.Reader, out io.Writer) error {
	raw, err := os.ReadFile(valuesPath)
	if err != nil {
		return err
	}
	var defaults map[string]any
	if err := yaml.Unmarshal(raw, &defaults); err != nil {
		return fmt.Errorf("%s: %w", valuesPath, err)
	}
	h, err := io.ReadAll(help)
	if err != nil {
		return err
	}
	flags := rendertest.FlagTypes(string(h))
	if len(flags) < 10 {
		return fmt.Errorf("stdin holds %d flags: pipe `pd-sidecar --help` into it", len(flags))
	}
	b, err := rendertest.ValuesSchema(defaults, flags)
	if err != nil {
		return err
	}
	_, err = out.Write(b)
	return err
}
