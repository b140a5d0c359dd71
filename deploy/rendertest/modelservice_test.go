package rendertest_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/pd-sidecar/pd-sidecar/deploy/rendertest"
	"github.com/pd-sidecar/pd-sidecar/deploy/rendertest/modelservice"
)

const fragmentFile = "../helm/llm-d-modelservice-values.yaml"

// proxy is a values set under routing.proxy.
func proxy(kv ...any) map[string]any {
	p := map[string]any{}
	for i := 0; i+1 < len(kv); i += 2 {
		p[kv[i].(string)] = kv[i+1]
	}
	return map[string]any{"routing": map[string]any{"proxy": p}}
}

// modelserviceCases are the values sets rendered into the fixture: the
// chart's defaults, each optional routing.proxy key the routingProxy
// template reads set to each value its values.yaml documents and removed
// (null) where the chart sets it by default, both connectors, other
// ports, tracing, all optional keys at once and none of them.
func modelserviceCases() []modelservice.Case {
	c := func(name string, v map[string]any) modelservice.Case { return modelservice.Case{Name: name, Values: v} }
	cases := []modelservice.Case{
		c("chart defaults", map[string]any{}),
		c("connector nixl", proxy("connector", "nixl")),
		c("connector nixlv2", proxy("connector", "nixlv2")),
		c("connector unset", proxy("connector", nil)),
		c("zapDevel true", proxy("zapDevel", true)),
		c("zapDevel false", proxy("zapDevel", false)),
		c("zapEncoder console", proxy("zapEncoder", "console")),
		c("zapEncoder unset", proxy("zapEncoder", nil)),
		c("zapLogLevel unset", proxy("zapLogLevel", nil)),
		c("secure true", proxy("secure", true)),
		c("secure unset", proxy("secure", nil)),
		c("prefillerUseTLS true", proxy("prefillerUseTLS", true)),
		c("prefillerUseTLS false", proxy("prefillerUseTLS", false)),
		c("certPath", proxy("certPath", "/certs")),
		c("targetPort", proxy("targetPort", 9200)),
		c("servicePort", map[string]any{"routing": map[string]any{"servicePort": 9000}}),
		c("decode data parallel 2", map[string]any{"decode": map[string]any{"parallelism": map[string]any{"data": 2}}}),
		c("tracing enabled", map[string]any{"tracing": map[string]any{"enabled": true}}),
		c("no optional keys", proxy("secure", nil, "zapEncoder", nil, "zapLogLevel", nil)),
		c("every optional key", proxy("connector", "nixl", "zapDevel", true, "zapEncoder", "console", "zapLogLevel", 5,
			"zapStacktraceLevel", "panic", "zapTimeEncoding", "iso8601", "secure", true, "prefillerUseTLS", true, "certPath", "/certs")),
	}
	for _, l := range []any{"debug", "info", "error", "panic", 1, 4, 5} {
		cases = append(cases, c("zapLogLevel "+jsonString(l), proxy("zapLogLevel", l)))
	}
	for _, l := range []string{"info", "error", "panic"} {
		cases = append(cases, c("zapStacktraceLevel "+l, proxy("zapStacktraceLevel", l)))
	}
	for _, e := range []string{"epoch", "millis", "nano", "iso8601", "rfc3339", "rfc3339nano"} {
		cases = append(cases, c("zapTimeEncoding "+e, proxy("zapTimeEncoding", e)))
	}
	return cases
}

func jsonString(v any) string {
	b, _ := json.Marshal(v)
	return strings.Trim(string(b), `"`)
}

// TestModelserviceFixtureRefresh renders llm-d's modelservice chart from a
// clone (MODELSERVICE_REPO: a clone or bare git directory of
// github.com/llm-d-incubation/llm-d-modelservice; MODELSERVICE_REF,
// default HEAD) with the Helm Go SDK and rewrites the fixture
// testdata/llm-d-modelservice.json. Skipped without MODELSERVICE_REPO:
// `make modelservice-fixture MODELSERVICE_REPO=...` refreshes it.
func TestModelserviceFixtureRefresh(t *testing.T) {
	repo := os.Getenv("MODELSERVICE_REPO")
	if repo == "" {
		t.Skip("MODELSERVICE_REPO not set: refreshing the fixture needs a clone of llm-d-modelservice, which make test does not fetch; the committed fixture is what the other tests read")
	}
	ref := os.Getenv("MODELSERVICE_REF")
	if ref == "" {
		ref = "HEAD"
	}
	git := func(args ...string) string {
		out, err := exec.Command("git", append([]string{"-C", repo}, args...)...).Output()
		require.NoError(t, err, "git %v", args)
		return strings.TrimSpace(string(out))
	}
	commit := git("rev-parse", ref+"^{commit}")
	dir := t.TempDir()
	arch := exec.Command("git", "-C", repo, "archive", "--format=tar", commit, "charts/llm-d-modelservice")
	untar := exec.Command("tar", "-x", "-C", dir)
	var err error
	untar.Stdin, err = arch.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, untar.Start())
	require.NoError(t, arch.Run())
	require.NoError(t, untar.Wait())
	chartDir := filepath.Join(dir, "charts", "llm-d-modelservice")

	ch, err := loader.Load(chartDir)
	require.NoError(t, err)
	routing, _ := ch.Values["routing"].(map[string]any)
	defaults, _ := routing["proxy"].(map[string]any)
	require.NotEmpty(t, defaults, "the chart has routing.proxy values")

	fragment := readFragment(t)
	f := modelservice.Fixture{
		Chart:         ch.Metadata.Name,
		ChartVersion:  ch.Metadata.Version,
		AppVersion:    ch.Metadata.AppVersion,
		Repository:    "https://github.com/llm-d-incubation/llm-d-modelservice",
		Commit:        commit,
		CommitDate:    git("log", "-1", "--format=%cI", commit),
		Generated:     time.Now().UTC().Format("2006-01-02"),
		ProxyDefaults: defaults,
		Fragment:      fragment,
	}
	cases := append(modelserviceCases(), modelservice.Case{Name: "pd-sidecar fragment", Values: fragment})
	for _, c := range cases {
		c.Container = renderRoutingProxy(t, chartDir, c.Values)
		f.Cases = append(f.Cases, c)
	}
	// The keys the template reads: a one-key case that renders another
	// container than the chart's defaults.
	base := f.Cases[0].Container
	read := map[string]bool{}
	for _, c := range f.Cases {
		p, ok := onlyProxy(c.Values)
		if ok && len(p) == 1 && !reflect.DeepEqual(c.Container, base) {
			for k := range p {
				read[k] = true
			}
		}
	}
	for k := range read {
		f.TemplateKeys = append(f.TemplateKeys, k)
	}
	sort.Strings(f.TemplateKeys)

	b, err := json.MarshalIndent(f, "", "  ")
	require.NoError(t, err)
	require.NoError(t, os.WriteFile("testdata/llm-d-modelservice.json", append(b, '\n'), 0o644))
}

// onlyProxy returns values' routing.proxy map when that is all it sets.
func onlyProxy(values map[string]any) (map[string]any, bool) {
	r, ok := values["routing"].(map[string]any)
	if !ok || len(values) != 1 || len(r) != 1 {
		return nil, false
	}
	p, ok := r["proxy"].(map[string]any)
	return p, ok
}

// renderRoutingProxy renders the chart with values and returns the decode
// Deployment's routing-proxy init container, the only place the chart
// renders the routing sidecar (prefill pods have none).
func renderRoutingProxy(t *testing.T, chartDir string, values map[string]any) modelservice.Container {
	t.Helper()
	o, err := rendertest.Render(chartDir, deepCopy(t, values))
	require.NoError(t, err)
	var found []corev1.Container
	for _, d := range o.Deployments {
		for _, c := range d.Spec.Template.Spec.InitContainers {
			if c.Name == "routing-proxy" {
				found = append(found, c)
			}
		}
		for _, c := range d.Spec.Template.Spec.Containers {
			require.NotEqual(t, "routing-proxy", c.Name)
		}
	}
	require.Len(t, found, 1, "one routing-proxy container with %v", values)
	b, err := json.Marshal(found[0])
	require.NoError(t, err)
	var c modelservice.Container
	require.NoError(t, json.Unmarshal(b, &c))
	return c
}

func deepCopy(t *testing.T, v map[string]any) map[string]any {
	b, err := json.Marshal(v)
	require.NoError(t, err)
	var out map[string]any
	require.NoError(t, json.Unmarshal(b, &out))
	return out
}

func readFragment(t *testing.T) map[string]any {
	t.Helper()
	b, err := os.ReadFile(fragmentFile)
	require.NoError(t, err)
	var v map[string]any
	require.NoError(t, yaml.Unmarshal(b, &v))
	return v
}

// lists returns the paths of every list in v.
func lists(v any, path string) []string {
	switch x := v.(type) {
	case []any:
		return []string{path}
	case map[string]any:
		var out []string
		for k, e := range x {
			out = append(out, lists(e, path+"."+k)...)
		}
		sort.Strings(out)
		return out
	}
	return nil
}

// TestModelserviceFragment checks deploy/helm/llm-d-modelservice-values.yaml
// against the recorded rendering of llm-d's modelservice chart: it sets no
// list (Helm replaces lists, so a list would wipe the user's own
// containers), only routing.proxy keys the chart has or its template reads,
// our image, and renders the chart's default arguments (the fixture must
// have been refreshed with this fragment).
func TestModelserviceFragment(t *testing.T) {
	f, err := modelservice.Load()
	require.NoError(t, err)
	frag := readFragment(t)
	assert.Empty(t, lists(frag, ""), "the fragment sets no list")
	p, ok := onlyProxy(frag)
	require.True(t, ok, "the fragment sets routing.proxy only, got %v", frag)
	known := map[string]bool{}
	for k := range f.ProxyDefaults {
		known[k] = true
	}
	for _, k := range f.TemplateKeys {
		known[k] = true
	}
	for k := range p {
		assert.True(t, known[k], "routing.proxy.%s is neither a value of %s %s nor read by its template", k, f.Chart, f.ChartVersion)
	}
	img, _ := p["image"].(string)
	assert.True(t, strings.HasPrefix(img, "ghcr.io/pd-sidecar/pd-sidecar:"), "image %q", img)
	assert.Equal(t, f.Fragment, frag, "the fragment changed since the fixture was written: refresh it (make modelservice-fixture)")

	byName := map[string]modelservice.Case{}
	for _, c := range f.Cases {
		byName[c.Name] = c
	}
	got, ok := byName["pd-sidecar fragment"]
	require.True(t, ok)
	def := byName["chart defaults"]
	assert.Equal(t, img, got.Container.Image)
	assert.Equal(t, def.Container.Args, got.Container.Args, "the fragment changes no argument")
}

// TestModelserviceFixtureFacts pins the facts docs/deploy.md states about
// the recorded chart, so a refreshed fixture that changes them fails here:
// the routing sidecar gets arguments from a fixed set of keys only, no
// environment but OTEL_* with tracing on, no probes, one port.
func TestModelserviceFixtureFacts(t *testing.T) {
	f, err := modelservice.Load()
	require.NoError(t, err)
	assert.Equal(t, "llm-d-modelservice", f.Chart)
	assert.Regexp(t, `^[0-9a-f]{40}$`, f.Commit)
	assert.Equal(t, []string{"certPath", "connector", "image", "prefillerUseTLS", "secure", "targetPort",
		"zapDevel", "zapEncoder", "zapLogLevel", "zapStacktraceLevel", "zapTimeEncoding"}, f.TemplateKeys)
	want := map[string]bool{"--port": true, "--vllm-port": true, "--connector": true, "--zap-devel": true, "--zap-encoder": true,
		"--zap-log-level": true, "--zap-stacktrace-level": true, "--zap-time-encoding": true, "--secure-proxy": true,
		"--prefiller-use-tls": true, "--cert-path": true}
	seen := map[string]bool{}
	for _, c := range f.Cases {
		ct := c.Container
		assert.Equal(t, "routing-proxy", ct.Name, c.Name)
		assert.Equal(t, "Always", ct.RestartPolicy, "%s: a native sidecar", c.Name)
		assert.Nil(t, ct.StartupProbe, c.Name)
		assert.Nil(t, ct.LivenessProbe, c.Name)
		assert.Nil(t, ct.ReadinessProbe, c.Name)
		assert.Len(t, ct.Ports, 1, c.Name)
		for _, e := range ct.Env {
			assert.True(t, strings.HasPrefix(e.Name, "OTEL_"), "%s: env %s", c.Name, e.Name)
		}
		for _, a := range ct.Args {
			name, _, _ := strings.Cut(a, "=")
			assert.True(t, want[name], "%s: argument %s", c.Name, a)
			seen[name] = true
		}
	}
	assert.Equal(t, want, seen, "every argument the template renders is exercised")
	var tracing, defaults modelservice.Case
	for _, c := range f.Cases {
		switch c.Name {
		case "tracing enabled":
			tracing = c
		case "chart defaults":
			defaults = c
		}
	}
	assert.Empty(t, defaults.Container.Env)
	assert.Equal(t, []string{"--port=8000", "--vllm-port=8200", "--connector=nixlv2", "--zap-encoder=json", "--zap-log-level=debug", "--secure-proxy=false"}, defaults.Container.Args)
	var env []string
	for _, e := range tracing.Container.Env {
		env = append(env, e.Name+"="+e.Value)
	}
	assert.Contains(t, env, "OTEL_EXPORTER_OTLP_ENDPOINT=http://otel-collector:4317")
	for _, c := range f.Cases {
		if c.Name == "decode data parallel 2" {
			assert.Equal(t, defaults.Container.Args, c.Container.Args, "no --data-parallel-size: the sidecar serves rank 0 only")
			assert.Equal(t, defaults.Container.Ports, c.Container.Ports)
		}
	}
}
