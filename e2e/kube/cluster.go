// Package kube runs a real Kubernetes control plane for the e2e tests:
// etcd (Debian's etcd-server) and kube-apiserver (built from
// k8s.io/kubernetes by `make kube-apiserver`, e2e/kube/apiserver), on
// loopback ports, with RBAC on, a static admin token, and the
// InferencePool CRDs of the Gateway API Inference Extension installed from
// that module's own YAML. No kubelet runs: tests create Pods and set their
// status (Ready, podIP) through the status subresource.
package kube

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/yaml"
)

// InferenceExtensionVersions are the Gateway API Inference Extension
// module versions whose CRD YAML is installed: v1.6.0 ships the v1
// InferencePool (inference.networking.k8s.io), v1.1.0 also the v1alpha2 one
// (inference.networking.x-k8s.io).
var InferenceExtensionVersions = map[string]string{
	"inference.networking.k8s.io_inferencepools.yaml":   "v1.6.0",
	"inference.networking.x-k8s.io_inferencepools.yaml": "v1.1.0",
}

const inferenceExtension = "sigs.k8s.io/gateway-api-inference-extension"

// Cluster is a running etcd and kube-apiserver.
type Cluster struct {
	// URL is the API server's https address; Kubeconfig a file for the
	// admin (system:masters) with the server's CA.
	URL        string
	Kubeconfig string
	// Admin is a client config as the admin; Client and Dynamic clients
	// of it.
	Admin   *rest.Config
	Client  kubernetes.Interface
	Dynamic dynamic.Interface

	dir      string
	etcdURL  string
	etcd     *process
	server   *process
	args     []string
	bin      string
	caPEM    []byte
	stopOnce sync.Once
}

// process is a child process and its output.
type process struct {
	cmd  *exec.Cmd
	done chan struct{}
	out  *os.File
}

func startProcess(dir, name, bin string, args ...string) (*process, error) {
	out, err := os.Create(filepath.Join(dir, name+".log"))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		out.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &process{cmd: cmd, done: make(chan struct{}), out: out}
	go func() {
		_ = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// stop sends SIGTERM and waits for the process to end (SIGKILL after d).
func (p *process) stop(d time.Duration) {
	if p == nil {
		return
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(d):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
	p.out.Close()
}

// Binaries returns the kube-apiserver and etcd to run: bin/kube-apiserver
// under root (make kube-apiserver) and etcd on the PATH, or an error that
// says how to get them.
func Binaries(root string) (apiserver, etcd string, err error) {
	apiserver = filepath.Join(root, "bin", "kube-apiserver")
	if _, err := os.Stat(apiserver); err != nil {
		return "", "", fmt.Errorf("kube: %s missing: run make kube-apiserver (builds it from k8s.io/kubernetes, ~10 minutes on 2 cores)", apiserver)
	}
	etcd, err = exec.LookPath("etcd")
	if err != nil {
		return "", "", errors.New("kube: etcd not on the PATH: apt-get install etcd-server (make test-k8s installs it)")
	}
	return apiserver, etcd, nil
}

// Start runs etcd and kube-apiserver for t, installs the InferencePool
// CRDs, and stops both when t ends.
func Start(t testing.TB, root string) *Cluster {
	t.Helper()
	apiserver, etcd, err := Binaries(root)
	if err != nil {
		t.Fatal(err)
	}
	c := &Cluster{dir: t.TempDir(), bin: apiserver}
	t.Cleanup(c.Stop)
	if err := c.start(etcd); err != nil {
		t.Fatalf("kube: %v\n--- etcd ---\n%s\n--- kube-apiserver ---\n%s", err, c.log("etcd"), c.log("kube-apiserver"))
	}
	if err := c.InstallInferencePoolCRDs(); err != nil {
		t.Fatalf("kube: %v", err)
	}
	return c
}

func (c *Cluster) log(name string) string {
	b, _ := os.ReadFile(filepath.Join(c.dir, name+".log"))
	if len(b) > 8<<10 {
		b = b[len(b)-8<<10:]
	}
	return string(b)
}

// freePort returns a port of 127.0.0.1 that was free a moment ago, drawn
// below Linux's ephemeral range (32768 and up) as the e2e harness draws its
// own: a port the kernel just gave a listener on :0 is the kind it gives
// next to an outgoing connection, which could take it before etcd or the
// API server binds it.
func freePort() (int, error) {
	for range 200 {
		port := 20000 + mrand.IntN(12000)
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			continue
		}
		l.Close()
		return port, nil
	}
	return 0, errors.New("kube: no free port below 32768")
}

// AdminToken is the static token of the admin user (system:masters).
const AdminToken = "pd-sidecar-test-admin"

func (c *Cluster) start(etcdBin string) error {
	client, err := freePort()
	if err != nil {
		return err
	}
	peer, err := freePort()
	if err != nil {
		return err
	}
	c.etcdURL = "http://127.0.0.1:" + strconv.Itoa(client)
	c.etcd, err = startProcess(c.dir, "etcd", etcdBin, "--data-dir", filepath.Join(c.dir, "etcd"),
		"--listen-client-urls", c.etcdURL, "--advertise-client-urls", c.etcdURL,
		"--listen-peer-urls", "http://127.0.0.1:"+strconv.Itoa(peer),
		"--initial-advertise-peer-urls", "http://127.0.0.1:"+strconv.Itoa(peer),
		"--initial-cluster", "default=http://127.0.0.1:"+strconv.Itoa(peer), "--log-level", "warn")
	if err != nil {
		return err
	}
	if err := waitFor(30*time.Second, func() bool {
		resp, err := http.Get(c.etcdURL + "/health")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}); err != nil {
		return fmt.Errorf("etcd not healthy: %w", err)
	}

	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	saKey := filepath.Join(c.dir, "sa.key")
	if err := os.WriteFile(saKey, pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}), 0o600); err != nil {
		return err
	}
	tokens := filepath.Join(c.dir, "tokens.csv")
	if err := os.WriteFile(tokens, []byte(AdminToken+",admin,admin,system:masters\n"), 0o600); err != nil {
		return err
	}
	port, err := freePort()
	if err != nil {
		return err
	}
	c.URL = "https://127.0.0.1:" + strconv.Itoa(port)
	c.args = []string{"--etcd-servers", c.etcdURL, "--secure-port", strconv.Itoa(port), "--bind-address", "127.0.0.1",
		"--cert-dir", filepath.Join(c.dir, "certs"), "--service-account-issuer", "https://kubernetes.default.svc",
		"--service-account-key-file", saKey, "--service-account-signing-key-file", saKey,
		"--token-auth-file", tokens, "--authorization-mode", "RBAC", "--service-cluster-ip-range", "10.96.0.0/16",
		// No controller-manager creates the default ServiceAccount of a
		// namespace; pods name none.
		"--disable-admission-plugins", "ServiceAccount"}
	return c.startServer()
}

// startServer starts kube-apiserver (again) and waits until it is ready.
func (c *Cluster) startServer() error {
	var err error
	c.server, err = startProcess(c.dir, "kube-apiserver", c.bin, c.args...)
	if err != nil {
		return err
	}
	if err := waitFor(90*time.Second, func() bool {
		ca, err := os.ReadFile(filepath.Join(c.dir, "certs", "apiserver.crt"))
		if err != nil {
			return false
		}
		c.caPEM = ca
		return c.ready()
	}); err != nil {
		return fmt.Errorf("kube-apiserver not ready: %w", err)
	}
	return c.clients()
}

// ready reports whether /readyz answers ok to the admin.
func (c *Cluster) ready() bool {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(c.caPEM) {
		return false
	}
	hc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	req, _ := http.NewRequest(http.MethodGet, c.URL+"/readyz", nil)
	req.Header.Set("Authorization", "Bearer "+AdminToken)
	resp, err := hc.Do(req)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

func (c *Cluster) clients() error {
	c.Admin = &rest.Config{Host: c.URL, BearerToken: AdminToken, TLSClientConfig: rest.TLSClientConfig{CAData: c.caPEM},
		QPS: 200, Burst: 400}
	var err error
	if c.Client, err = kubernetes.NewForConfig(c.Admin); err != nil {
		return err
	}
	if c.Dynamic, err = dynamic.NewForConfig(c.Admin); err != nil {
		return err
	}
	c.Kubeconfig, err = c.WriteKubeconfig("admin", AdminToken)
	return err
}

// WriteKubeconfig writes a kubeconfig for a user with a bearer token and
// returns its path.
func (c *Cluster) WriteKubeconfig(name, token string) (string, error) {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["test"] = &clientcmdapi.Cluster{Server: c.URL, CertificateAuthorityData: c.caPEM}
	cfg.AuthInfos[name] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts[name] = &clientcmdapi.Context{Cluster: "test", AuthInfo: name}
	cfg.CurrentContext = name
	path := filepath.Join(c.dir, "kubeconfig-"+name)
	return path, clientcmd.WriteToFile(*cfg, path)
}

// RestartServer stops kube-apiserver, leaves it down for down, and starts
// it again on the same port and etcd.
func (c *Cluster) RestartServer(down time.Duration) error {
	c.server.stop(30 * time.Second)
	time.Sleep(down)
	return c.startServer()
}

// StopServer stops kube-apiserver (etcd runs on); StartServer starts it
// again.
func (c *Cluster) StopServer()        { c.server.stop(30 * time.Second) }
func (c *Cluster) StartServer() error { return c.startServer() }

// ServerPID and EtcdPID are the processes' ids (their resident memory
// is read from /proc).
func (c *Cluster) ServerPID() int { return c.server.cmd.Process.Pid }
func (c *Cluster) EtcdPID() int   { return c.etcd.cmd.Process.Pid }

// Get returns the body of an admin GET of path (e.g. /metrics).
func (c *Cluster) Get(ctx context.Context, path string) ([]byte, error) {
	return c.Client.CoreV1().RESTClient().Get().AbsPath(path).DoRaw(ctx)
}

// Stop stops kube-apiserver and etcd.
func (c *Cluster) Stop() {
	c.stopOnce.Do(func() {
		c.server.stop(30 * time.Second)
		c.etcd.stop(10 * time.Second)
	})
}

// Compact compacts etcd to its current revision, so that a watch resumed
// from an older resource version gets 410 Gone.
func (c *Cluster) Compact(ctx context.Context) error {
	post := func(path, body string) (map[string]any, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.etcdURL+path, strings.NewReader(body))
		if err != nil {
			return nil, err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return nil, err
		}
		defer resp.Body.Close()
		var out map[string]any
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
			return nil, err
		}
		if resp.StatusCode != http.StatusOK {
			return nil, fmt.Errorf("etcd %s: %d %v", path, resp.StatusCode, out)
		}
		return out, nil
	}
	// etcd 3.4's gRPC gateway: the current revision from a range, then a
	// physical compaction to it.
	r, err := post("/v3/kv/range", `{"key":"AA=="}`)
	if err != nil {
		return err
	}
	h, _ := r["header"].(map[string]any)
	rev, _ := h["revision"].(string)
	if rev == "" {
		return fmt.Errorf("etcd range: no revision in %v", r)
	}
	_, err = post("/v3/kv/compaction", `{"revision":"`+rev+`","physical":true}`)
	return err
}

// InstallInferencePoolCRDs creates the InferencePool CRDs from the
// inference extension module's YAML (downloaded by the go command into the
// module cache) and waits until they are established.
func (c *Cluster) InstallInferencePoolCRDs() error {
	crdGVR := schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for file, version := range InferenceExtensionVersions {
		dir, err := moduleDir(c.dir, inferenceExtension, version)
		if err != nil {
			return err
		}
		b, err := os.ReadFile(filepath.Join(dir, "config", "crd", "bases", file))
		if err != nil {
			return fmt.Errorf("CRD %s of %s@%s: %w", file, inferenceExtension, version, err)
		}
		var obj map[string]any
		if err := yaml.Unmarshal(b, &obj); err != nil {
			return fmt.Errorf("CRD %s: %w", file, err)
		}
		u := &unstructured.Unstructured{Object: obj}
		if _, err := c.Dynamic.Resource(crdGVR).Create(ctx, u, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("create CRD %s: %w", u.GetName(), err)
		}
		if err := waitFor(30*time.Second, func() bool {
			got, err := c.Dynamic.Resource(crdGVR).Get(ctx, u.GetName(), metav1.GetOptions{})
			if err != nil {
				return false
			}
			conds, _, _ := unstructured.NestedSlice(got.Object, "status", "conditions")
			for _, cd := range conds {
				m, _ := cd.(map[string]any)
				if m["type"] == "Established" && m["status"] == "True" {
					return true
				}
			}
			return false
		}); err != nil {
			return fmt.Errorf("CRD %s not established: %w", u.GetName(), err)
		}
	}
	return nil
}

// moduleDir returns the directory of module@version in the module cache,
// downloading it (and checking it against the checksum database) first;
// the go command runs in work, outside any module, so that no go.sum is
// touched.
func moduleDir(work, module, version string) (string, error) {
	cmd := exec.Command("go", "mod", "download", "-json", module+"@"+version)
	cmd.Dir = work
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("go mod download %s@%s: %w", module, version, err)
	}
	var m struct{ Dir, Error string }
	if err := json.Unmarshal(out, &m); err != nil {
		return "", err
	}
	if m.Error != "" || m.Dir == "" {
		return "", fmt.Errorf("go mod download %s@%s: %s", module, version, m.Error)
	}
	return m.Dir, nil
}

// waitFor polls cond every 50 ms until it holds, or fails after d.
func waitFor(d time.Duration, cond func() bool) error {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("not within %v", d)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return nil
}
