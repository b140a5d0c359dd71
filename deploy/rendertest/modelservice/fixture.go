// Package modelservice reads the recorded facts of llm-d's modelservice
// chart (llm-d-incubation/llm-d-modelservice): for each values set that
// matters, the routing-proxy container its templates rendered. The fixture
// is written by TestModelserviceFixtureRefresh in deploy/rendertest from a
// real clone of the chart; tests read it without the network. Nothing of
// the chart's own source is kept, only what it rendered.
package modelservice

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
)

// FixtureFile is the fixture's path relative to the repository root.
const FixtureFile = "deploy/rendertest/testdata/llm-d-modelservice.json"

// Fixture is one rendering of the chart.
type Fixture struct {
	Chart        string `json:"chart"`        // chart name (Chart.yaml)
	ChartVersion string `json:"chartVersion"` // chart version (Chart.yaml)
	AppVersion   string `json:"appVersion"`
	Repository   string `json:"repository"`
	Commit       string `json:"commit"`     // git commit the chart was rendered from
	CommitDate   string `json:"commitDate"` // that commit's date
	Generated    string `json:"generated"`  // when the fixture was written (UTC date)
	// ProxyDefaults is the chart's own routing.proxy values (values.yaml).
	ProxyDefaults map[string]any `json:"proxyDefaults"`
	// TemplateKeys are the routing.proxy keys whose setting changed the
	// rendered routing-proxy container: the keys the template reads
	// (found by rendering one key at a time; enabled, imagePullPolicy and
	// routing.servicePort are read too but are not rendered alone here).
	TemplateKeys []string `json:"templateKeys"`
	// Fragment is deploy/helm/llm-d-modelservice-values.yaml as it was
	// when the fixture was written (its "pd-sidecar fragment" case renders it).
	Fragment map[string]any `json:"fragment"`
	Cases    []Case         `json:"cases"`
}

// Case is one values set and what the chart rendered from it.
type Case struct {
	Name string `json:"name"`
	// Values are layered over the chart's defaults (a null removes a
	// default key, as helm install --set key=null does).
	Values    map[string]any `json:"values"`
	Container Container      `json:"container"`
}

// Container is the rendered routing-proxy container. A probe that is absent
// was not rendered.
type Container struct {
	Name            string          `json:"name"`
	Image           string          `json:"image"`
	ImagePullPolicy string          `json:"imagePullPolicy,omitempty"`
	Args            []string        `json:"args"`
	Env             []EnvVar        `json:"env,omitempty"`
	Ports           []Port          `json:"ports,omitempty"`
	RestartPolicy   string          `json:"restartPolicy,omitempty"`
	StartupProbe    json.RawMessage `json:"startupProbe,omitempty"`
	LivenessProbe   json.RawMessage `json:"livenessProbe,omitempty"`
	ReadinessProbe  json.RawMessage `json:"readinessProbe,omitempty"`
	SecurityContext json.RawMessage `json:"securityContext,omitempty"`
	Resources       json.RawMessage `json:"resources,omitempty"`
}

// EnvVar is a rendered environment variable (the chart renders only values).
type EnvVar struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

// Port is a rendered container port.
type Port struct {
	ContainerPort int    `json:"containerPort"`
	Protocol      string `json:"protocol,omitempty"`
}

// Path is the fixture's absolute path, found from this source file's place
// in the repository, so tests in any package can read it.
func Path() (string, error) {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return "", fmt.Errorf("modelservice fixture: no caller information")
	}
	root := filepath.Join(filepath.Dir(file), "..", "..", "..")
	return filepath.Join(root, filepath.FromSlash(FixtureFile)), nil
}

// Load reads the fixture.
func Load() (Fixture, error) {
	p, err := Path()
	if err != nil {
		return Fixture{}, err
	}
	b, err := os.ReadFile(p)
	if err != nil {
		return Fixture{}, fmt.Errorf("modelservice fixture: %w", err)
	}
	var f Fixture
	if err := json.Unmarshal(b, &f); err != nil {
		return Fixture{}, fmt.Errorf("modelservice fixture %s: %w", p, err)
	}
	if len(f.Cases) == 0 {
		return Fixture{}, fmt.Errorf("modelservice fixture %s: no cases", p)
	}
	return f, nil
}

// ArgLists returns the distinct rendered argument lists, each with the
// names of the cases that rendered it, in a stable order.
func (f Fixture) ArgLists() []ArgList {
	by := map[string]*ArgList{}
	var keys []string
	for _, c := range f.Cases {
		k := strings.Join(c.Container.Args, "\x00")
		if by[k] == nil {
			by[k] = &ArgList{Args: c.Container.Args}
			keys = append(keys, k)
		}
		by[k].Cases = append(by[k].Cases, c.Name)
	}
	sort.Strings(keys)
	out := make([]ArgList, 0, len(keys))
	for _, k := range keys {
		out = append(out, *by[k])
	}
	return out
}

// ArgList is one distinct argument list and the cases that rendered it.
type ArgList struct {
	Args  []string
	Cases []string
}
