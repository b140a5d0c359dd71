package benchsuite

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// streamMem is one proxy's memory with streams open, and its CPU while
// they stream.
type streamMem struct {
	streams     int
	idle, open  float64 // MiB
	perStreamKB float64
	// usPerEvent is the proxy's CPU per SSE event relayed while the streams
	// run (each event one token of the engine's).
	usPerEvent float64
}

// streamWindow is how long the CPU per streamed event is measured.
const streamWindow = 3 * time.Second

// streamMemory starts a slow engine and a fresh instance of each proxy in
// front of it, opens o.Streams long streams through each in turn, and
// reads the proxy's RSS with them all open.
func streamMemory(ctx context.Context, o Options, launch func(string, string, ...string) (*proc, error), ports []int) (map[string]streamMem, error) {
	engine := ports[0]
	if _, err := launch("engine-slow", filepath.Join(o.Bin, "engine-sim"), "--role", "decode", "--port", itoa(engine),
		"--model", "sim-model", "--prefill-us-per-token", "0", "--decode-us-per-token", "50000",
		"--max-running", fmt.Sprint(o.Streams+100), "--log-level", "warn"); err != nil {
		return nil, err
	}
	if err := waitHTTP(ctx, baseURL(engine)+"/health", 20*time.Second); err != nil {
		return nil, err
	}
	type cand struct {
		name string
		port int
		p    *proc
	}
	var cands []cand
	sc, err := launch("sidecar-streams", filepath.Join(o.Bin, "pd-sidecar"), "--port", itoa(ports[1]),
		"--model-server-port", itoa(engine), "--log-level", "warn", "--max-idle-conns-per-host", fmt.Sprint(o.Streams+100))
	if err != nil {
		return nil, err
	}
	cands = append(cands, cand{"sidecar", ports[1], sc})
	// The same sidecar with a goroutine per open stream, for what the event
	// loops change.
	sg, err := launch("sidecar-goroutines", filepath.Join(o.Bin, "pd-sidecar"), "--port", itoa(ports[6]),
		"--model-server-port", itoa(engine), "--log-level", "warn", "--max-idle-conns-per-host", fmt.Sprint(o.Streams+100),
		"--stream-loops", "0")
	if err != nil {
		return nil, err
	}
	cands = append(cands, cand{"sidecar-goroutines", ports[6], sg})
	if o.Nginx != "" {
		p, err := startNginx(o.Dir, o.Nginx, ports[2], engine)
		if err != nil {
			return nil, err
		}
		defer p.stop()
		cands = append(cands, cand{"nginx", ports[2], p})
	}
	if o.RefProxy != "" {
		p, err := launch("go-proxy-streams", o.RefProxy, "refproxy", "--port", itoa(ports[5]), "--upstream", hostPort(engine))
		if err != nil {
			return nil, err
		}
		cands = append(cands, cand{"go-proxy", ports[5], p})
	}
	if o.Peer != "" {
		p, err := launch("peer-streams", o.Peer, "--port", itoa(ports[3]), "--model-server-port", itoa(engine),
			"--secure-proxy=false", "--kv-connector", "nixlv2")
		if err != nil {
			return nil, err
		}
		cands = append(cands, cand{"peer", ports[3], p})
	}
	if len(cands) == 0 {
		return nil, errNoProxy
	}
	body := []byte(`{"model":"sim-model","messages":[{"role":"user","content":"keep streaming"}],"max_tokens":100000,"stream":true}`)
	out := map[string]streamMem{}
	for _, c := range cands {
		if err := waitHTTP(ctx, baseURL(c.port)+"/v1/models", 20*time.Second); err != nil {
			return nil, fmt.Errorf("%s: %w", c.name, err)
		}
		idle, err := treeUsage(c.p.pid())
		if err != nil {
			return nil, err
		}
		fmt.Printf("  opening %d streams through %s...\n", o.Streams, c.name)
		octx, cancel := context.WithTimeout(ctx, 60*time.Second)
		closeAll, opened, err := openStreams(octx, hostPort(c.port), "/v1/chat/completions", body, o.Streams, nil)
		cancel()
		time.Sleep(500 * time.Millisecond) // let buffers settle
		open, uerr := treeUsage(c.p.pid())
		var usPerEvent float64
		if err == nil && uerr == nil {
			usPerEvent, uerr = cpuPerEvent(ctx, c.p.pid(), baseURL(engine)+"/metrics")
		}
		closeAll()
		if err != nil {
			return nil, fmt.Errorf("%s: %d of %d streams opened: %w", c.name, opened, o.Streams, err)
		}
		if uerr != nil {
			return nil, uerr
		}
		m := streamMem{streams: opened, idle: mib(idle.RSS), open: mib(open.RSS), usPerEvent: usPerEvent}
		m.perStreamKB = float64(open.RSS-idle.RSS) / 1024 / float64(opened)
		out[c.name] = m
		time.Sleep(time.Second) // let the engine see the streams end
	}
	return out, nil
}

// cpuPerEvent measures pid's CPU over streamWindow against the tokens the
// engine (metrics at metricsURL) generated meanwhile.
func cpuPerEvent(ctx context.Context, pid int, metricsURL string) (float64, error) {
	u0, err := treeUsage(pid)
	if err != nil {
		return 0, err
	}
	t0, err := generatedTokens(ctx, metricsURL)
	if err != nil {
		return 0, err
	}
	time.Sleep(streamWindow)
	u1, err := treeUsage(pid)
	if err != nil {
		return 0, err
	}
	t1, err := generatedTokens(ctx, metricsURL)
	if err != nil {
		return 0, err
	}
	if t1 <= t0 {
		return 0, fmt.Errorf("the engine generated no tokens in %v", streamWindow)
	}
	return float64((u1.CPU - u0.CPU).Microseconds()) / (t1 - t0), nil
}

// generatedTokens reads engine-sim's vllm:generation_tokens_total.
func generatedTokens(ctx context.Context, url string) (float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		rest, ok := strings.CutPrefix(line, "vllm:generation_tokens_total")
		if !ok || rest == "" || (rest[0] != ' ' && rest[0] != '{') {
			continue
		}
		f := strings.Fields(line)
		return strconv.ParseFloat(f[len(f)-1], 64)
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, errors.New("engine metrics: no vllm:generation_tokens_total")
}
