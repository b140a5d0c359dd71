package multiturnbench

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/pd-sidecar/pd-sidecar/benchsuite"
	"github.com/pd-sidecar/pd-sidecar/promscrape"
)

// rig is one mode's processes, all stopped when the mode ends.
type rig struct {
	bin, dir string
	procs    []*benchsuite.Process
}

// stop ends every process still running, the last started first.
func (r *rig) stop() {
	for i := len(r.procs) - 1; i >= 0; i-- {
		r.procs[i].Stop()
	}
	r.procs = nil
}

// start runs binary name of the rig's bin directory as process label and
// waits until health answers 200.
func (r *rig) start(ctx context.Context, binary, label, health string, args ...string) error {
	p, err := benchsuite.Start(r.dir, label, filepath.Join(r.bin, binary), args...)
	if err != nil {
		return err
	}
	r.procs = append(r.procs, p)
	if err := benchsuite.WaitHTTP(ctx, health, 20*time.Second); err != nil {
		return fmt.Errorf("%s (log %s): %w", label, filepath.Join(r.dir, label+".log"), err)
	}
	return nil
}

// endpoint is one process's HTTP port (and an engine's KV side channel).
type endpoint struct{ port, kvPort int }

func (e endpoint) hostPort() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(e.port)) }
func (e endpoint) url() string      { return "http://" + e.hostPort() }
func (e endpoint) metrics() string  { return e.url() + "/metrics" }

// engine starts an engine-sim named label in role with args added.
func (r *rig) engine(ctx context.Context, label, role string, args ...string) (endpoint, error) {
	ports, err := benchsuite.FreePorts(4)
	if err != nil {
		return endpoint{}, err
	}
	e := endpoint{port: ports[0], kvPort: ports[1]}
	all := append([]string{"--role", role, "--port", itoa(ports[0]), "--kv-port", itoa(ports[1]),
		"--bootstrap-port", itoa(ports[2]), "--p2p-port", itoa(ports[3]), "--model", model, "--log-level", "warn"}, args...)
	return e, r.start(ctx, "engine-sim", label, e.url()+"/health", all...)
}

// sidecar starts a pd-sidecar named label in front of the decode engine.
func (r *rig) sidecar(ctx context.Context, label string, decode endpoint, args ...string) (endpoint, error) {
	ports, err := benchsuite.FreePorts(1)
	if err != nil {
		return endpoint{}, err
	}
	s := endpoint{port: ports[0]}
	all := append([]string{"--port", itoa(s.port), "--model-server-port", itoa(decode.port), "--log-level", "warn"}, args...)
	return s, r.start(ctx, "pd-sidecar", label, s.url()+"/v1/models", all...)
}

// flagSet is the long flags a binary's --help lists.
type flagSet map[string]bool

// helpFlags runs bin --help and collects the flags it lists: what this
// build of engine-sim or pd-sidecar accepts.
func helpFlags(ctx context.Context, bin string) (flagSet, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "--help").CombinedOutput()
	if err != nil && len(out) == 0 {
		return nil, fmt.Errorf("%s --help: %w", bin, err)
	}
	return parseHelpFlags(string(out)), nil
}

// parseHelpFlags collects the long flags a pflag usage text defines: the
// first word of a line ("--name type  usage", after "-n, " for a flag with
// a shorthand), not flags that usage texts mention.
func parseHelpFlags(help string) flagSet {
	fs := flagSet{}
	for line := range strings.Lines(help) {
		f := strings.Fields(line)
		if len(f) > 1 && len(f[0]) == 3 && strings.HasPrefix(f[0], "-") && strings.HasSuffix(f[0], ",") {
			f = f[1:] // the shorthand "-n,"
		}
		if len(f) == 0 {
			continue
		}
		name, ok := strings.CutPrefix(f[0], "--")
		if !ok {
			continue
		}
		// "--name" or "--name[=true|false]" (a boolean)
		if i := strings.IndexAny(name, "=["); i >= 0 {
			name = name[:i]
		}
		if name != "" {
			fs[name] = true
		}
	}
	return fs
}

// scrape reads url's metrics.
func scrape(ctx context.Context, url string) (promscrape.Metrics, error) {
	return promscrape.Scrape(ctx, url)
}

// byLabel sums the series of name by the value of label.
func byLabel(m promscrape.Metrics, name, label string) map[string]float64 {
	out := map[string]float64{}
	fam, ok := m[name]
	if !ok {
		return out
	}
	for _, s := range fam.GetMetric() {
		v := ""
		for _, l := range s.GetLabel() {
			if l.GetName() == label {
				v = l.GetValue()
			}
		}
		// A series is one of these kinds; the getters of the others read 0.
		out[v] += s.GetCounter().GetValue() + s.GetGauge().GetValue() + s.GetUntyped().GetValue()
	}
	return out
}

func itoa(i int) string { return strconv.Itoa(i) }

func ftoa(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }
