// Package rendertest renders the pd-sidecar Helm chart with the Helm Go SDK
// and decodes every object strictly into k8s.io/api types, for the tests
// that validate the chart, the plain manifests, the dashboards and the
// Dockerfiles (make deploy-check). It is a test-support package: nothing in
// the sidecar imports it.
package rendertest

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"helm.sh/helm/v4/pkg/chart/common"
	"helm.sh/helm/v4/pkg/chart/common/util"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	"helm.sh/helm/v4/pkg/engine"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// Release is the release name and namespace the tests render with.
const (
	Release   = "pd"
	Namespace = "llm"
)

// Objects are the decoded objects of one rendering, by kind.
type Objects struct {
	Deployments     []appsv1.Deployment
	Services        []corev1.Service
	ServiceAccounts []corev1.ServiceAccount
	ConfigMaps      []corev1.ConfigMap
	Roles           []rbacv1.Role
	RoleBindings    []rbacv1.RoleBinding
	// Other holds kinds without k8s.io/api types (LeaderWorkerSet,
	// ServiceMonitor, InferencePool), decoded as plain maps.
	Other []map[string]any
	// Kinds counts every object by kind.
	Kinds map[string]int
}

// Render renders the chart in dir with values merged over its defaults and
// decodes every manifest.
func Render(dir string, values map[string]any) (Objects, error) {
	all, err := RenderYAML(dir, Release, Namespace, values)
	if err != nil {
		return Objects{}, err
	}
	return Decode(all)
}

// RenderYAML renders the chart in dir as release name in namespace, with
// values merged over its defaults (and checked against its
// values.schema.json), into one YAML stream, as `helm template` does.
func RenderYAML(dir, name, namespace string, values map[string]any) ([]byte, error) {
	ch, err := loader.Load(dir)
	if err != nil {
		return nil, fmt.Errorf("load chart %s: %w", dir, err)
	}
	vals, err := util.ToRenderValues(ch, values,
		common.ReleaseOptions{Name: name, Namespace: namespace, IsInstall: true}, common.DefaultCapabilities)
	if err != nil {
		return nil, fmt.Errorf("values: %w", err)
	}
	files, err := engine.Render(ch, vals)
	if err != nil {
		return nil, fmt.Errorf("render: %w", err)
	}
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	var all bytes.Buffer
	for _, n := range names {
		if !strings.HasSuffix(n, ".yaml") || strings.TrimSpace(files[n]) == "" {
			continue // NOTES.txt, helpers, templates turned off
		}
		all.WriteString("---\n# Source: " + n + "\n")
		all.WriteString(strings.TrimLeft(files[n], "\n"))
		all.WriteString("\n")
	}
	return all.Bytes(), nil
}

// DecodeFiles decodes every .yaml file under dir.
func DecodeFiles(dir string) (Objects, error) {
	var all bytes.Buffer
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".yaml") {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return fmt.Errorf("read %s: %w", p, err)
		}
		all.WriteString("\n---\n")
		all.Write(b)
		return nil
	})
	if err != nil {
		return Objects{}, err
	}
	return Decode(all.Bytes())
}

// Decode splits a multi-document YAML stream and decodes each object
// strictly (unknown fields are errors) into its k8s.io/api type.
func Decode(stream []byte) (Objects, error) {
	o := Objects{Kinds: map[string]int{}}
	for i, doc := range splitDocs(stream) {
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal(doc, &tm); err != nil {
			return o, fmt.Errorf("document %d: %w\n%s", i, err, numbered(doc))
		}
		if tm.Kind == "" {
			return o, fmt.Errorf("document %d has no kind:\n%s", i, doc)
		}
		o.Kinds[tm.Kind]++
		var err error
		switch tm.Kind {
		case "Deployment":
			err = strictAppend(doc, &o.Deployments)
		case "Service":
			err = strictAppend(doc, &o.Services)
		case "ServiceAccount":
			err = strictAppend(doc, &o.ServiceAccounts)
		case "ConfigMap":
			err = strictAppend(doc, &o.ConfigMaps)
		case "Role":
			err = strictAppend(doc, &o.Roles)
		case "RoleBinding":
			err = strictAppend(doc, &o.RoleBindings)
		default:
			var m map[string]any
			err = yaml.UnmarshalStrict(doc, &m)
			o.Other = append(o.Other, m)
		}
		if err != nil {
			return o, fmt.Errorf("document %d (%s): %w", i, tm.Kind, err)
		}
	}
	return o, nil
}

func strictAppend[T any](doc []byte, to *[]T) error {
	var v T
	if err := yaml.UnmarshalStrict(doc, &v); err != nil {
		return err
	}
	*to = append(*to, v)
	return nil
}

// splitDocs returns the non-empty documents of a YAML stream.
func splitDocs(stream []byte) [][]byte {
	var out [][]byte
	for _, d := range bytes.Split(stream, []byte("\n---")) {
		d = bytes.TrimPrefix(d, []byte("---"))
		if len(bytes.TrimSpace(stripComments(d))) > 0 {
			out = append(out, d)
		}
	}
	return out
}

func stripComments(d []byte) []byte {
	var b bytes.Buffer
	for _, l := range bytes.Split(d, []byte("\n")) {
		if !bytes.HasPrefix(bytes.TrimSpace(l), []byte("#")) {
			b.Write(l)
			b.WriteByte('\n')
		}
	}
	return b.Bytes()
}

// Sub strictly decodes the value at path (keys) of m into out, for objects
// whose kind has no k8s.io/api type but embeds one (a LeaderWorkerSet's pod
// templates).
func Sub(m map[string]any, out any, path ...string) error {
	var cur any = m
	for _, k := range path {
		mm, ok := cur.(map[string]any)
		if !ok {
			return fmt.Errorf("%s: not an object", strings.Join(path, "."))
		}
		if cur, ok = mm[k]; !ok {
			return fmt.Errorf("%s: missing", strings.Join(path, "."))
		}
	}
	b, err := yaml.Marshal(cur)
	if err != nil {
		return fmt.Errorf("%s: %w", strings.Join(path, "."), err)
	}
	if err := yaml.UnmarshalStrict(b, out); err != nil {
		return fmt.Errorf("%s: %w", strings.Join(path, "."), err)
	}
	return nil
}

// numbered prefixes each line of doc with its number, for error messages.
func numbered(doc []byte) string {
	var b strings.Builder
	for i, l := range strings.Split(string(doc), "\n") {
		fmt.Fprintf(&b, "%4d %s\n", i+1, l)
	}
	return b.String()
}
