package benchsuite

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"time"
)

// proc is one child process of the suite.
type proc struct {
	name string
	cmd  *exec.Cmd
	log  *os.File
}

// start runs bin with args, its output to a log file in dir.
func start(dir, name, bin string, args ...string) (*proc, error) {
	return startEnv(dir, name, bin, nil, args...)
}

// startEnv is start with env added to the process's environment.
func startEnv(dir, name, bin string, env []string, args ...string) (*proc, error) {
	log, err := os.Create(fmt.Sprintf("%s/%s.log", dir, name))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		log.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	return &proc{name: name, cmd: cmd, log: log}, nil
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

// stop ends the process group and waits.
func (p *proc) stop() {
	_ = syscall.Kill(-p.pid(), syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = p.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		_ = syscall.Kill(-p.pid(), syscall.SIGKILL)
		<-done
	}
	p.log.Close()
}

// waitHTTP polls url until it answers 200.
func waitHTTP(ctx context.Context, url string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(30 * time.Millisecond):
		}
	}
	return fmt.Errorf("%s did not answer 200 within %v", url, timeout)
}

// freePorts returns n distinct free loopback ports.
func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func hostPort(port int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) }
func baseURL(port int) string  { return "http://" + hostPort(port) }

// Process is a child process started by Start: its own process group, its
// output in a log file. Other benchmarks (pd-bench tail) start theirs with
// it.
type Process struct{ p *proc }

// Start runs bin with args in its own process group, its output to
// dir/name.log.
func Start(dir, name, bin string, args ...string) (*Process, error) {
	p, err := start(dir, name, bin, args...)
	if err != nil {
		return nil, err
	}
	return &Process{p: p}, nil
}

// PID is the process's id (its process group's too).
func (p *Process) PID() int { return p.p.pid() }

// Stop ends the process group (SIGTERM, SIGKILL after 5 s) and waits.
func (p *Process) Stop() { p.p.stop() }

// Kill ends the process group at once with SIGKILL, as a crash would, and
// waits.
func (p *Process) Kill() {
	_ = syscall.Kill(-p.p.pid(), syscall.SIGKILL)
	_ = p.p.cmd.Wait()
	p.p.log.Close()
}

// WaitHTTP polls url until it answers 200, for at most timeout.
func WaitHTTP(ctx context.Context, url string, timeout time.Duration) error {
	return waitHTTP(ctx, url, timeout)
}

// FreePorts returns n distinct free loopback ports.
func FreePorts(n int) ([]int, error) { return freePorts(n) }
