package rendertest_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/pd-sidecar/pd-sidecar/deploy/rendertest"
	"github.com/pd-sidecar/pd-sidecar/e2e/harness"
)

const chartDir = "../helm/pd-sidecar"

// defaultFlags reads sidecar.flags from the chart's values.yaml.
func defaultFlags(t *testing.T) map[string]any {
	t.Helper()
	b, err := os.ReadFile(chartDir + "/values.yaml")
	require.NoError(t, err)
	var v struct {
		Sidecar struct {
			Flags map[string]any `json:"flags"`
		} `json:"sidecar"`
	}
	require.NoError(t, yaml.Unmarshal(b, &v))
	require.NotEmpty(t, v.Sidecar.Flags)
	return v.Sidecar.Flags
}

// wantArgs is the chart's documented rule, computed independently: one
// --name=value per flag in name order; booleans always, lists joined, null
// and "" left out.
func wantArgs(flags map[string]any) []string {
	names := make([]string, 0, len(flags))
	for n := range flags {
		names = append(names, n)
	}
	sort.Strings(names)
	var out []string
	for _, n := range names {
		switch v := flags[n].(type) {
		case nil:
		case bool:
			out = append(out, fmt.Sprintf("--%s=%t", n, v))
		case float64:
			out = append(out, fmt.Sprintf("--%s=%d", n, int64(v)))
		case int:
			out = append(out, fmt.Sprintf("--%s=%d", n, v))
		case []any:
			if len(v) > 0 {
				s := make([]string, len(v))
				for i, e := range v {
					s[i] = fmt.Sprint(e)
				}
				out = append(out, fmt.Sprintf("--%s=%s", n, strings.Join(s, ",")))
			}
		case string:
			if v != "" {
				out = append(out, fmt.Sprintf("--%s=%s", n, v))
			}
		default:
			out = append(out, fmt.Sprintf("--%s=%v", n, v))
		}
	}
	return out
}

func merged(base map[string]any, over map[string]any) map[string]any {
	out := map[string]any{}
	for k, v := range base {
		out[k] = v
	}
	for k, v := range over {
		out[k] = v
	}
	return out
}

// podOf returns the single decode pod template of a rendering.
func podOf(t *testing.T, o rendertest.Objects) corev1.PodSpec {
	t.Helper()
	require.Len(t, o.Deployments, 1)
	return o.Deployments[0].Spec.Template.Spec
}

// sidecarOf returns the native sidecar and asserts it is one.
func sidecarOf(t *testing.T, ps corev1.PodSpec) corev1.Container {
	t.Helper()
	require.Len(t, ps.InitContainers, 1, "the sidecar is the only init container")
	c := ps.InitContainers[0]
	require.Equal(t, "pd-sidecar", c.Name)
	require.NotNil(t, c.RestartPolicy, "a native sidecar has restartPolicy Always")
	require.Equal(t, corev1.ContainerRestartPolicyAlways, *c.RestartPolicy)
	return c
}

func portNamed(c corev1.Container, name string) (int32, bool) {
	for _, p := range c.Ports {
		if p.Name == name {
			return p.ContainerPort, true
		}
	}
	return 0, false
}

// assertHardened checks the sidecar's security context and probes.
func assertHardened(t *testing.T, c corev1.Container, scheme corev1.URIScheme) {
	t.Helper()
	sc := c.SecurityContext
	require.NotNil(t, sc)
	assert.True(t, *sc.RunAsNonRoot)
	assert.NotZero(t, *sc.RunAsUser)
	assert.True(t, *sc.ReadOnlyRootFilesystem)
	assert.False(t, *sc.AllowPrivilegeEscalation)
	assert.False(t, *sc.Privileged)
	assert.Equal(t, []corev1.Capability{"ALL"}, sc.Capabilities.Drop)
	assert.Empty(t, sc.Capabilities.Add)
	probes := []struct {
		name  string
		probe *corev1.Probe
		path  string
	}{
		{"liveness", c.LivenessProbe, "/health"},
		{"startup", c.StartupProbe, "/health"},
		{"readiness", c.ReadinessProbe, "/ready"},
	}
	for _, p := range probes {
		require.NotNil(t, p.probe, p.name)
		require.NotNil(t, p.probe.HTTPGet, p.name)
		assert.Equal(t, p.path, p.probe.HTTPGet.Path, p.name)
		got := p.probe.HTTPGet.Scheme
		if got == "" {
			got = corev1.URISchemeHTTP // the API's default
		}
		assert.Equal(t, scheme, got, p.name)
		_, ok := portNamed(c, p.probe.HTTPGet.Port.String())
		assert.True(t, ok, "%s probe port %q is a declared container port", p.name, p.probe.HTTPGet.Port.String())
	}
	assert.False(t, c.Resources.Requests.Cpu().IsZero())
	assert.False(t, c.Resources.Limits.Memory().IsZero())
}

// engineKVConfig returns the decode engine's --kv-transfer-config.
func engineKVConfig(t *testing.T, c corev1.Container) map[string]any {
	t.Helper()
	for _, a := range c.Args {
		if v, ok := strings.CutPrefix(a, "--kv-transfer-config="); ok {
			var m map[string]any
			require.NoError(t, json.Unmarshal([]byte(v), &m))
			return m
		}
	}
	t.Fatalf("engine has no --kv-transfer-config: %v", c.Args)
	return nil
}

func TestChartRenders(t *testing.T) {
	defaults := defaultFlags(t)
	tests := []struct {
		name   string
		values map[string]any
		check  func(t *testing.T, o rendertest.Objects)
	}{
		{
			name:   "defaults",
			values: nil,
			check: func(t *testing.T, o rendertest.Objects) {
				ps := podOf(t, o)
				c := sidecarOf(t, ps)
				assert.Equal(t, wantArgs(defaults), c.Args)
				assertHardened(t, c, corev1.URISchemeHTTP)
				port, ok := portNamed(c, "http")
				require.True(t, ok)
				assert.EqualValues(t, 8000, port)
				require.Len(t, ps.Containers, 1)
				e := ps.Containers[0]
				assert.Contains(t, e.Args, "--port=8200", "the engine listens on --model-server-port")
				kv := engineKVConfig(t, e)
				assert.Equal(t, "fail", kv["kv_load_failure_policy"])
				assert.Equal(t, "NixlConnector", kv["kv_connector"])
				assert.Empty(t, o.Roles, "no RBAC without SSRF protection")
				assert.Zero(t, o.Kinds["ServiceMonitor"])
				require.Len(t, o.Services, 1)
				assert.EqualValues(t, 8000, o.Services[0].Spec.Ports[0].Port)
				assert.Equal(t, "decode", o.Deployments[0].Spec.Template.Labels["llm-d.ai/role"])
				require.Len(t, o.ServiceAccounts, 1)
				assert.Equal(t, o.ServiceAccounts[0].Name, ps.ServiceAccountName)
				gmp := envNamed(t, c, "GOMAXPROCS")
				require.NotNil(t, gmp.ValueFrom, "GOMAXPROCS from the CPU request")
				require.NotNil(t, gmp.ValueFrom.ResourceFieldRef)
				assert.Equal(t, "requests.cpu", gmp.ValueFrom.ResourceFieldRef.Resource)
				assert.Equal(t, "pd-sidecar", gmp.ValueFrom.ResourceFieldRef.ContainerName)
				assert.Equal(t, "1", gmp.ValueFrom.ResourceFieldRef.Divisor.String())
				assert.Equal(t, "500m", c.Resources.Requests.Cpu().String(), "the request it is sized from")
			},
		},
		{
			name:   "GOMAXPROCS set outright",
			values: map[string]any{"sidecar": map[string]any{"gomaxprocs": 4}},
			check: func(t *testing.T, o rendertest.Objects) {
				gmp := envNamed(t, sidecarOf(t, podOf(t, o)), "GOMAXPROCS")
				assert.Equal(t, "4", gmp.Value)
				assert.Nil(t, gmp.ValueFrom)
			},
		},
		{
			name:   "GOMAXPROCS left to Go",
			values: map[string]any{"sidecar": map[string]any{"gomaxprocs": ""}},
			check: func(t *testing.T, o rendertest.Objects) {
				for _, e := range sidecarOf(t, podOf(t, o)).Env {
					assert.NotEqual(t, "GOMAXPROCS", e.Name)
				}
			},
		},
		{
			name: "data parallel, metrics port, service monitor, tracing",
			values: map[string]any{
				"sidecar": map[string]any{
					"flags": map[string]any{
						"data-parallel-size": 2, "metrics-port": 9090, "tracing": true,
						"prefill-timeout": "5s", "enable-prefiller-sampling": true, "decode-tp-size": 4,
					},
					"extraArgs": []any{"--log-level=debug"},
					"otel":      map[string]any{"endpoint": "http://otel-collector.monitoring:4318"},
				},
				"metrics": map[string]any{"serviceMonitor": map[string]any{"enabled": true, "labels": map[string]any{"release": "prom"}}},
			},
			check: func(t *testing.T, o rendertest.Objects) {
				c := sidecarOf(t, podOf(t, o))
				want := wantArgs(merged(defaults, map[string]any{
					"data-parallel-size": 2.0, "metrics-port": 9090.0, "tracing": true,
					"prefill-timeout": "5s", "enable-prefiller-sampling": true, "decode-tp-size": 4.0,
				}))
				assert.Equal(t, append(want, "--log-level=debug"), c.Args)
				for name, port := range map[string]int32{"http": 8000, "http-r1": 8001, "metrics": 9090} {
					got, ok := portNamed(c, name)
					assert.True(t, ok, name)
					assert.Equal(t, port, got, name)
				}
				env := map[string]string{}
				for _, e := range c.Env {
					env[e.Name] = e.Value
				}
				assert.Equal(t, "http://otel-collector.monitoring:4318", env["OTEL_EXPORTER_OTLP_ENDPOINT"])
				assert.Equal(t, "http/protobuf", env["OTEL_EXPORTER_OTLP_PROTOCOL"], "the chart's :4318 endpoint is OTLP/HTTP")
				assert.Equal(t, "parentbased_traceidratio", env["OTEL_TRACES_SAMPLER"])
				require.Equal(t, 1, o.Kinds["ServiceMonitor"])
				sm := o.Other[0]
				assert.Equal(t, "ServiceMonitor", sm["kind"])
				ep := sm["spec"].(map[string]any)["endpoints"].([]any)[0].(map[string]any)
				assert.Equal(t, "metrics", ep["port"])
				assert.Equal(t, "/metrics", ep["path"])
				assert.Equal(t, []any{map[string]any{"targetLabel": "pool", "replacement": "pd-pd-sidecar", "action": "replace"}}, ep["relabelings"],
					"no inference-pool: the series' pool is the release")
				assert.Equal(t, "prom", sm["metadata"].(map[string]any)["labels"].(map[string]any)["release"])
				var svcPorts []string
				for _, p := range o.Services[0].Spec.Ports {
					svcPorts = append(svcPorts, p.TargetPort.String())
				}
				assert.Equal(t, []string{"http", "metrics"}, svcPorts)
			},
		},
		{
			name: "ssrf protection gets its RBAC in the pool's namespace",
			values: map[string]any{"sidecar": map[string]any{"flags": map[string]any{
				"enable-ssrf-protection": true, "inference-pool": "pools/qwen-pool",
			}}, "metrics": map[string]any{"serviceMonitor": map[string]any{"enabled": true}}},
			check: func(t *testing.T, o rendertest.Objects) {
				require.Equal(t, 1, o.Kinds["ServiceMonitor"])
				ep := o.Other[0]["spec"].(map[string]any)["endpoints"].([]any)[0].(map[string]any)
				assert.Equal(t, []any{map[string]any{"targetLabel": "pool", "replacement": "qwen-pool", "action": "replace"}}, ep["relabelings"],
					"the series' pool is the InferencePool's name")
				c := sidecarOf(t, podOf(t, o))
				assert.Contains(t, c.Args, "--enable-ssrf-protection=true")
				assert.Contains(t, c.Args, "--inference-pool=pools/qwen-pool")
				require.Len(t, o.Roles, 1)
				role := o.Roles[0]
				assert.Equal(t, "pools", role.Namespace)
				var groups []string
				for _, r := range role.Rules {
					assert.ElementsMatch(t, []string{"get", "list", "watch"}, r.Verbs, "read-only")
					groups = append(groups, r.APIGroups...)
					if slices.Contains(r.APIGroups, "inference.networking.k8s.io") {
						assert.Equal(t, []string{"inferencepools"}, r.Resources)
					}
				}
				assert.ElementsMatch(t, []string{"", "inference.networking.k8s.io", "inference.networking.x-k8s.io"}, groups)
				require.Len(t, o.RoleBindings, 1)
				rb := o.RoleBindings[0]
				assert.Equal(t, role.Name, rb.RoleRef.Name)
				require.Len(t, rb.Subjects, 1)
				assert.Equal(t, o.ServiceAccounts[0].Name, rb.Subjects[0].Name)
				assert.Equal(t, rendertest.Namespace, rb.Subjects[0].Namespace)
			},
		},
		{
			name: "a bare pool name gets its RBAC in namespace default, where the sidecar watches it",
			values: map[string]any{"sidecar": map[string]any{"flags": map[string]any{
				"enable-ssrf-protection": true, "inference-pool": "qwen-pool",
			}}},
			check: func(t *testing.T, o rendertest.Objects) {
				require.Len(t, o.Roles, 1)
				assert.Equal(t, "default", o.Roles[0].Namespace)
				require.Len(t, o.RoleBindings, 1)
				assert.Equal(t, "default", o.RoleBindings[0].Namespace)
			},
		},
		{
			name: "secure proxy probes over HTTPS",
			values: map[string]any{
				"sidecar": map[string]any{
					"flags": map[string]any{
						"secure-proxy": true, "cert-path": "/etc/pd-sidecar/tls", "kv-connector": "sglang",
						"on-kv-load-failure": "error", "enable-tls": []any{"prefiller", "decoder"},
					},
					"volumeMounts": []any{map[string]any{"name": "tls", "mountPath": "/etc/pd-sidecar/tls", "readOnly": true}},
				},
				"volumes": []any{map[string]any{"name": "tls", "secret": map[string]any{"secretName": "pd-sidecar-tls"}}},
			},
			check: func(t *testing.T, o rendertest.Objects) {
				ps := podOf(t, o)
				c := sidecarOf(t, ps)
				assertHardened(t, c, corev1.URISchemeHTTPS)
				assert.Contains(t, c.Args, "--enable-tls=prefiller,decoder")
				assert.Contains(t, c.Args, "--cert-path=/etc/pd-sidecar/tls")
				require.Len(t, c.VolumeMounts, 1)
				require.Len(t, ps.Volumes, 1)
				assert.Equal(t, ps.Volumes[0].Name, c.VolumeMounts[0].Name)
				assert.Equal(t, "pd-sidecar-tls", ps.Volumes[0].Secret.SecretName)
				assert.Contains(t, c.Args, "--kv-connector=sglang")
				assert.Contains(t, c.Args, "--on-kv-load-failure=error")
			},
		},
		{
			name: "configuration file from a ConfigMap",
			values: map[string]any{"sidecar": map[string]any{
				"configuration": map[string]any{
					"port": 9000, "kv-connector": "sglang", "enable-tls": []any{"prefiller", "decoder"},
					"prefill-retry-backoff": "300ms", "secure-proxy": true, "metrics-port": 9090,
				},
				"volumeMounts": []any{map[string]any{"name": "tls", "mountPath": "/etc/pd-sidecar/tls", "readOnly": true}},
			}, "podAnnotations": map[string]any{"team": "inference"}},
			check: func(t *testing.T, o rendertest.Objects) {
				assert.Equal(t, "inference", o.Deployments[0].Spec.Template.Annotations["team"], "podAnnotations kept")
				ps := podOf(t, o)
				c := sidecarOf(t, ps)
				rest := map[string]any{}
				for k, v := range defaults {
					switch k {
					case "port", "kv-connector", "enable-tls", "prefill-retry-backoff", "secure-proxy", "metrics-port":
					default:
						rest[k] = v
					}
				}
				assert.Equal(t, append(wantArgs(rest), "--configuration-file=/etc/pd-sidecar/configuration/sidecar.yaml"), c.Args,
					"the flags the file names are left off the command line, which would win over it")
				require.Len(t, o.ConfigMaps, 1)
				cm := o.ConfigMaps[0]
				var file map[string]any
				require.NoError(t, yaml.UnmarshalStrict([]byte(cm.Data["sidecar.yaml"]), &file))
				assert.Equal(t, map[string]any{
					"port": 9000.0, "kv-connector": "sglang", "enable-tls": []any{"prefiller", "decoder"},
					"prefill-retry-backoff": "300ms", "secure-proxy": true, "metrics-port": 9090.0,
				}, file)
				require.Len(t, c.VolumeMounts, 2, "the user's mount and the configuration's")
				assert.Equal(t, "tls", c.VolumeMounts[0].Name)
				m := c.VolumeMounts[1]
				assert.Equal(t, "/etc/pd-sidecar/configuration", m.MountPath)
				assert.True(t, m.ReadOnly)
				var vol *corev1.Volume
				for i := range ps.Volumes {
					if ps.Volumes[i].Name == m.Name {
						vol = &ps.Volumes[i]
					}
				}
				require.NotNil(t, vol, "a volume for the mount")
				require.NotNil(t, vol.ConfigMap)
				assert.Equal(t, cm.Name, vol.ConfigMap.Name)
				// The chart reads the file's values where it needs them.
				port, ok := portNamed(c, "http")
				require.True(t, ok)
				assert.EqualValues(t, 9000, port)
				_, ok = portNamed(c, "metrics")
				assert.True(t, ok, "metrics-port from the file")
				assert.Equal(t, corev1.URISchemeHTTPS, c.ReadinessProbe.HTTPGet.Scheme, "secure-proxy from the file")
				assert.EqualValues(t, 9000, o.Services[0].Spec.Ports[0].Port)
				assert.Len(t, o.Deployments[0].Spec.Template.Annotations["pd-sidecar/configuration-checksum"], 64,
					"a changed configuration rolls the pods")
			},
		},
		{
			name:   "no configuration, no ConfigMap",
			values: nil,
			check: func(t *testing.T, o rendertest.Objects) {
				assert.Empty(t, o.ConfigMaps)
				assert.Empty(t, o.Deployments[0].Spec.Template.Annotations)
				for _, a := range sidecarOf(t, podOf(t, o)).Args {
					assert.NotContains(t, a, "--configuration")
				}
			},
		},
		{
			name: "leader worker set: the sidecar in the leader only",
			values: map[string]any{
				"workload": map[string]any{"kind": "LeaderWorkerSet", "groupSize": 4, "replicas": 2},
				"engine":   map[string]any{"tensorParallelSize": 8, "kvTransferConfig": map[string]any{"kv_load_failure_policy": "fail"}},
			},
			check: func(t *testing.T, o rendertest.Objects) {
				assert.Empty(t, o.Deployments)
				require.Equal(t, 1, o.Kinds["LeaderWorkerSet"])
				lws := o.Other[0]
				assert.Equal(t, "leaderworkerset.x-k8s.io/v1", lws["apiVersion"])
				var leader, worker corev1.PodTemplateSpec
				require.NoError(t, rendertest.Sub(lws, &leader, "spec", "leaderWorkerTemplate", "leaderTemplate"))
				require.NoError(t, rendertest.Sub(lws, &worker, "spec", "leaderWorkerTemplate", "workerTemplate"))
				var size int
				require.NoError(t, rendertest.Sub(lws, &size, "spec", "leaderWorkerTemplate", "size"))
				assert.Equal(t, 4, size)
				c := sidecarOf(t, leader.Spec)
				assertHardened(t, c, corev1.URISchemeHTTP)
				assert.Empty(t, worker.Spec.InitContainers)
				require.Len(t, worker.Spec.Containers, 1)
				assert.Contains(t, worker.Spec.Containers[0].Args, "--tensor-parallel-size=8")
				assert.Equal(t, "fail", engineKVConfig(t, leader.Spec.Containers[0])["kv_load_failure_policy"])
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o, err := rendertest.Render(chartDir, tc.values)
			require.NoError(t, err)
			tc.check(t, o)
		})
	}
}

func TestChartRefusesBadValues(t *testing.T) {
	tests := []struct {
		name   string
		values map[string]any
		want   string
	}{
		{"engine may not recompute silently",
			map[string]any{"engine": map[string]any{"kvTransferConfig": map[string]any{"kv_load_failure_policy": "recompute"}}},
			`kv_load_failure_policy must be "fail"`},
		{"unknown workload kind", map[string]any{"workload": map[string]any{"kind": "StatefulSet"}},
			"workload.kind must be Deployment or LeaderWorkerSet"},
		{"a configuration file and a configuration flag",
			map[string]any{"sidecar": map[string]any{"configuration": map[string]any{"port": 9000}, "flags": map[string]any{"configuration-file": "/x.yaml"}}},
			"sidecar.configuration cannot be combined"},
		{"a configuration naming another",
			map[string]any{"sidecar": map[string]any{"configuration": map[string]any{"configuration": "{}"}}},
			"a configuration cannot name another"},
		{"service monitor without a service",
			map[string]any{"service": map[string]any{"enabled": false}, "metrics": map[string]any{"serviceMonitor": map[string]any{"enabled": true}}},
			"needs service.enabled"},
		// values.schema.json: a key the chart does not read, or a value of
		// the wrong type, fails instead of being ignored.
		{"flags at the top level instead of under sidecar", map[string]any{"flags": map[string]any{"enable-ssrf-protection": true}},
			"additional properties 'flags' not allowed"},
		{"a flag that does not exist", map[string]any{"sidecar": map[string]any{"flags": map[string]any{"enable-ssrf-protecton": true}}},
			"additional properties 'enable-ssrf-protecton' not allowed"},
		{"a flag of the wrong type", map[string]any{"sidecar": map[string]any{"flags": map[string]any{"port": "eighty"}}},
			"/sidecar/flags/port"},
		{"a duration that is not one", map[string]any{"sidecar": map[string]any{"flags": map[string]any{"prefill-timeout": "10 seconds"}}},
			"/sidecar/flags/prefill-timeout"},
		{"a bool as a word", map[string]any{"sidecar": map[string]any{"flags": map[string]any{"tracing": "yes"}}},
			"/sidecar/flags/tracing"},
		{"a misspelt chart key", map[string]any{"sidecar": map[string]any{"imagee": map[string]any{"tag": "1"}}},
			"additional properties 'imagee' not allowed"},
		{"a chart key of the wrong type", map[string]any{"workload": map[string]any{"replicas": "two"}},
			"/workload/replicas"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := rendertest.Render(chartDir, tc.values)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

var flagRE = regexp.MustCompile(`(?m)^\s+(?:-\w, )?--([a-z0-9][a-z0-9-]*)`)

// TestChartCoversEveryFlag keeps the chart's values in step with the
// binary: every flag `pd-sidecar --help` lists has a key under
// sidecar.flags, and every key there is a real flag (else the sidecar
// would refuse to start).
func TestChartCoversEveryFlag(t *testing.T) {
	bin := harness.Binary(t, "pd-sidecar")
	out, err := exec.Command(bin, "--help").CombinedOutput()
	require.NoError(t, err, "%s", out)
	var flags []string
	for _, m := range flagRE.FindAllStringSubmatch(string(out), -1) {
		if m[1] != "help" {
			flags = append(flags, m[1])
		}
	}
	require.Greater(t, len(flags), 10, "parsed --help:\n%s", out)
	values := defaultFlags(t)
	for _, f := range flags {
		_, ok := values[f]
		assert.True(t, ok, "flag --%s has no value under sidecar.flags in deploy/helm/pd-sidecar/values.yaml", f)
	}
	for k := range values {
		assert.Contains(t, flags, k, "sidecar.flags.%s in values.yaml is not a pd-sidecar flag", k)
	}
}

// envNamed returns the container's environment variable name.
func envNamed(t *testing.T, c corev1.Container, name string) corev1.EnvVar {
	t.Helper()
	for _, e := range c.Env {
		if e.Name == name {
			return e
		}
	}
	t.Fatalf("no %s in the environment of %s", name, c.Name)
	return corev1.EnvVar{}
}

// TestChartConfigurationStartsTheSidecar starts the real sidecar with the
// arguments the chart renders for sidecar.configuration and the ConfigMap's
// file, so the file the chart writes is one the sidecar takes, and what it
// carries (ports, connector) is applied.
func TestChartConfigurationStartsTheSidecar(t *testing.T) {
	port, metricsPort := harness.FreePorts(t, 4), harness.FreePort(t)
	o, err := rendertest.Render(chartDir, map[string]any{"sidecar": map[string]any{"configuration": map[string]any{
		"port": port, "model-server-port": harness.FreePort(t), "metrics-port": metricsPort,
		"kv-connector": "sglang", "enable-tls": []any{"prefiller", "decoder"}, "prefill-retry-backoff": "300ms",
		"max-request-body-bytes": 16777216, "enable-prefiller-sampling": true,
	}}})
	require.NoError(t, err)
	require.Len(t, o.ConfigMaps, 1)
	file := t.TempDir() + "/sidecar.yaml"
	require.NoError(t, os.WriteFile(file, []byte(o.ConfigMaps[0].Data["sidecar.yaml"]), 0o600))
	args := sidecarOf(t, podOf(t, o)).Args
	const mounted = "--configuration-file=/etc/pd-sidecar/configuration/sidecar.yaml"
	require.Contains(t, args, mounted)
	for i, a := range args {
		if a == mounted {
			args[i] = "--configuration-file=" + file
		}
	}
	p := harness.Start(t, harness.Binary(t, "pd-sidecar"), args...)
	p.WaitHTTP(t, harness.URL(port)+"/health", 30*time.Second)
	p.WaitHTTP(t, harness.URL(metricsPort)+"/metrics", 10*time.Second)
	harness.Eventually(t, 5*time.Second, "the start-up log line", func() bool {
		return strings.Contains(p.Output(), `"kv_connector":"sglang"`)
	})
}

// TestValuesSchemaIsCurrent: the committed values.schema.json is the one
// `make schema` generates from values.yaml and this binary's flags, so a
// new flag or chart key cannot be left out of it.
func TestValuesSchemaIsCurrent(t *testing.T) {
	out, err := exec.Command(harness.Binary(t, "pd-sidecar"), "--help").Output()
	require.NoError(t, err)
	raw, err := os.ReadFile(chartDir + "/values.yaml")
	require.NoError(t, err)
	var defaults map[string]any
	require.NoError(t, yaml.Unmarshal(raw, &defaults))
	want, err := rendertest.ValuesSchema(defaults, rendertest.FlagTypes(string(out)))
	require.NoError(t, err)
	have, err := os.ReadFile(chartDir + "/values.schema.json")
	require.NoError(t, err)
	assert.JSONEq(t, string(want), string(have), "deploy/helm/pd-sidecar/values.schema.json is out of date: run make schema")
	assert.Len(t, rendertest.FlagTypes(string(out)), len(flagRE.FindAllString(string(out), -1)), "every flag of --help has a type")
}

// TestValuesSchemaAcceptsEveryFlagForm: each flag type takes its natural
// YAML forms, null and "" (not passed).
func TestValuesSchemaAcceptsEveryFlagForm(t *testing.T) {
	for _, flags := range []map[string]any{
		{"port": 9000, "prefill-timeout": "1m30s", "tracing": true, "enable-tls": []any{"prefiller"}},
		{"enable-tls": "prefiller,decoder", "zap-log-level": 5, "kv-probe-interval": "0"},
		{"zap-log-level": "debug", "port": nil, "host": "", "prefill-timeout": ""},
	} {
		_, err := rendertest.Render(chartDir, map[string]any{"sidecar": map[string]any{"flags": flags}})
		assert.NoError(t, err, "%v", flags)
	}
}
