// Package harness starts the project's real binaries on loopback ports for
// end-to-end tests: it builds each binary once per test process, picks free
// ports, waits for readiness, scrapes Prometheus metrics and stops everything
// when the test ends.
package harness

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/pd-sidecar/pd-sidecar/promscrape"
)

// builds caches one compiled binary per command name for the whole test
// process. It is guarded by buildMu; tests in one package share it.
var (
	buildMu sync.Mutex
	builds  = map[string]string{}
	tmpDir  string
)

// RepoRoot returns the module root (the directory holding go.mod).
func RepoRoot(t testing.TB) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("harness: cannot locate source file")
	}
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// Binary compiles ./cmd/<name> once per test process (with -race when the
// test binary itself was built with it) and returns the executable's path.
func Binary(t testing.TB, name string) string {
	t.Helper()
	buildMu.Lock()
	defer buildMu.Unlock()
	if p, ok := builds[name]; ok {
		return p
	}
	if tmpDir == "" {
		d, err := os.MkdirTemp("", "pd-e2e-bin-")
		if err != nil {
			t.Fatalf("harness: temp dir: %v", err)
		}
		tmpDir = d
	}
	out := filepath.Join(tmpDir, name)
	args := []string{"build", "-o", out}
	if raceEnabled {
		args = append(args, "-race")
	}
	if buildTags != "" {
		args = append(args, "-tags", buildTags)
	}
	args = append(args, "./cmd/"+name)
	cmd := exec.Command("go", args...)
	cmd.Dir = RepoRoot(t)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("harness: go build %s: %v\n%s", name, err, b)
	}
	builds[name] = out
	return out
}

// handedOut remembers the ports FreePort and FreePorts returned to tests
// that are still running, so two callers never get the same one while
// neither has bound it yet. A port is forgotten when its test ends (its
// processes are stopped by then: their cleanups run first), so a long run
// (-count=3 of the whole e2e package) never exhausts the ephemeral range.
var (
	portMu    sync.Mutex
	handedOut = map[int]bool{}
)

// forgetPorts lets ports first..first+n-1 be handed out again once t ends.
func forgetPorts(t testing.TB, first, n int) {
	t.Cleanup(func() {
		portMu.Lock()
		defer portMu.Unlock()
		for p := first; p < first+n; p++ {
			delete(handedOut, p)
		}
	})
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago and
// that no call of a test still running returned. It is drawn below Linux's
// ephemeral range (32768 and up), as FreePorts' runs are: a port the kernel
// just handed to a listener on :0 is the kind it hands next to an outgoing
// connection, which would take it before the process meant to bind it does.
func FreePort(t testing.TB) int {
	t.Helper()
	return FreePorts(t, 1)
}

// errPortTaken is what a process that lost one of its ports between
// FreePort and its bind prints (another process, or another test binary
// running beside this one, took it): its start is tried again on new ports.
const errPortTaken = "address already in use"

// startAttempts bounds how often a process that lost a port is restarted.
const startAttempts = 3

// Proc is one running child process.
type Proc struct {
	Name string
	cmd  *exec.Cmd
	out  *lockedBuffer
	done chan struct{}
	err  error
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Start runs bin with args. Its combined output is kept and printed with
// t.Log when the test fails. The process is killed at test cleanup.
func Start(t testing.TB, bin string, args ...string) *Proc {
	t.Helper()
	p := &Proc{Name: filepath.Base(bin), out: &lockedBuffer{}, done: make(chan struct{})}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Stdout = p.out
	p.cmd.Stderr = p.out
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("harness: start %s: %v", bin, err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.Kill()
		// A race-built binary reports a data race on its output and runs on:
		// that fails the test that ran it.
		if strings.Contains(p.Output(), "WARNING: DATA RACE") {
			t.Errorf("harness: %s reported a data race", p.Name)
		}
		if t.Failed() {
			t.Logf("--- output of %s %s ---\n%s", p.Name, strings.Join(args, " "), p.Output())
		}
	})
	return p
}

// Pid is the process id.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Output returns what the process printed so far.
func (p *Proc) Output() string { return p.out.String() }

// Signal sends sig to the process.
func (p *Proc) Signal(sig os.Signal) error { return p.cmd.Process.Signal(sig) }

// Kill stops the process at once and waits for it.
func (p *Proc) Kill() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// Wait waits up to d for the process to exit and returns its exit code, or
// an error when it is still running.
func (p *Proc) Wait(d time.Duration) (int, error) {
	select {
	case <-p.done:
		return p.cmd.ProcessState.ExitCode(), nil
	case <-time.After(d):
		return 0, errors.New("harness: process still running")
	}
}

// Exited reports whether the process has ended.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// WaitHTTP polls url until it answers 200 or timeout passes.
func (p *Proc) WaitHTTP(t testing.TB, url string, timeout time.Duration) {
	t.Helper()
	if err := p.waitHTTP(url, timeout); err != nil {
		t.Fatalf("harness: %v", err)
	}
}

// waitHTTP is WaitHTTP's wait, its failure returned.
func (p *Proc) waitHTTP(url string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if p.Exited() {
			return fmt.Errorf("%s exited before %s answered:\n%s", p.Name, url, p.Output())
		}
		resp, err := http.Get(url)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("%s did not answer 200 within %v:\n%s", url, timeout, p.Output())
}

// startOnFreePorts runs start until its process answers, at most
// startAttempts times: each try gets new ports from FreePort/FreePorts, and a
// try is repeated only when its process exited because a port it was given
// was taken meanwhile (retry says whether the ports were all the harness's
// to choose). Any other failure fails the test at once.
func startOnFreePorts(t testing.TB, retry bool, start func() (*Proc, string)) *Proc {
	t.Helper()
	for attempt := 1; ; attempt++ {
		p, url := start()
		err := p.waitHTTP(url, 30*time.Second)
		if err == nil {
			return p
		}
		if !retry || attempt == startAttempts || !p.Exited() || !strings.Contains(p.Output(), errPortTaken) {
			t.Fatalf("harness: %v", err)
		}
		t.Logf("harness: %s lost a port before binding it; starting it again on new ports", p.Name)
	}
}

// Metrics is one scrape of a Prometheus endpoint (promscrape.Metrics:
// Value sums its series by label).
type Metrics = promscrape.Metrics

// Scrape fetches and parses url (a /metrics endpoint).
func Scrape(t testing.TB, url string) Metrics {
	t.Helper()
	m, err := promscrape.Scrape(context.Background(), url)
	if err != nil {
		t.Fatalf("harness: %v", err)
	}
	return m
}

// Metric scrapes url and returns Value(name, labels).
func Metric(t testing.TB, url, name string, labels map[string]string) float64 {
	t.Helper()
	return Scrape(t, url).Value(name, labels)
}

// Eventually polls cond every 20ms until it is true or timeout passes.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if cond() {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("harness: not true within %v: %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// HostPort formats 127.0.0.1:port.
func HostPort(port int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) }

// URL formats http://127.0.0.1:port.
func URL(port int) string { return fmt.Sprintf("http://%s", HostPort(port)) }

func itoa(i int) string { return strconv.Itoa(i) }
