package benchsuite

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/pd-sidecar/pd-sidecar/loadgen"
)

// The ramp run: Ramp streaming chat requests released at once through
// each target in turn, each on its own connection, in front of an engine
// that sends a stream's first token at once and each of the others a
// second later, so every stream stays open while the rest arrive. It
// times each stream's first event from just before its dial: what a
// proxy's accepting, reading and upstream dialing cost when thousands of
// clients arrive together.
const (
	// rampTokens is each stream's max_tokens: its first event at once,
	// then one a second.
	rampTokens = 10
	// rampTimeout bounds one target's streams, from the release to the
	// last stream's end.
	rampTimeout = 60 * time.Second
)

// rampReport is the ramp run's result.
type rampReport struct {
	Streams int `json:"streams"`
	// Rate is the streams' arrivals per second, 0 for all at once.
	Rate    float64      `json:"rate,omitempty"`
	Targets []rampTarget `json:"targets"`
}

// rampTarget is one target's streams.
type rampTarget struct {
	Name    string `json:"name"`
	Streams int    `json:"streams"`
	// OK counts the streams that ended with data: [DONE]; CutShort those
	// that had their first event and ended without it; Errors the others
	// (no connection, no 200, no first event, an error event), by kind in
	// ErrorKinds.
	OK         int                 `json:"ok"`
	Errors     int                 `json:"errors"`
	CutShort   int                 `json:"cut_short"`
	ErrorKinds map[string]int      `json:"error_kinds,omitempty"`
	TTFT       loadgen.Percentiles `json:"ttft"`
}

// rampStream is what one stream of the ramp saw.
type rampStream struct {
	// first is set when the stream had its first event, ttft after
	// how long.
	first bool
	ttft  time.Duration
	// done is set when the stream ended with data: [DONE].
	done bool
	// err is the kind of error, "" for none.
	err string
}

// summarizeRamp digests one target's streams: every stream that had its
// first event counts in the TTFT percentiles, cut short or not.
func summarizeRamp(name string, streams []rampStream) rampTarget {
	t := rampTarget{Name: name, Streams: len(streams)}
	var ttft []time.Duration
	for _, s := range streams {
		if s.first {
			ttft = append(ttft, s.ttft)
		}
		switch {
		case s.err != "":
			t.Errors++
			if t.ErrorKinds == nil {
				t.ErrorKinds = map[string]int{}
			}
			t.ErrorKinds[s.err]++
		case !s.done:
			t.CutShort++
		default:
			t.OK++
		}
	}
	t.TTFT = rampPercentiles(ttft)
	return t
}

// rampPercentiles are ds's p50, p90, p99 and max in milliseconds, nearest
// rank below as loadgen reports them (zero for none).
func rampPercentiles(ds []time.Duration) loadgen.Percentiles {
	if len(ds) == 0 {
		return loadgen.Percentiles{}
	}
	ds = slices.Clone(ds)
	slices.Sort(ds)
	at := func(p float64) float64 {
		return float64(ds[int(p*float64(len(ds)-1))]) / float64(time.Millisecond)
	}
	return loadgen.Percentiles{P50: at(0.50), P90: at(0.90), P99: at(0.99), Max: at(1)}
}

// writeRampTable writes the ramp run's table.
func writeRampTable(w io.Writer, r *rampReport) error {
	fmt.Fprintf(w, "\nramp: %d chat streams %s through each target in turn, each on its own connection; engine-sim's first token at once, then one a second (%d tokens)\n",
		r.Streams, r.arrival(), rampTokens)
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "target\tstreams\tok\terrors\tcut\tTTFT p50\tp90\tp99\tmax\t")
	for _, t := range r.Targets {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%.1f\t%.1f\t%.1f\t%.1f\t\n", t.Name, t.Streams, t.OK, t.Errors, t.CutShort,
			t.TTFT.P50, t.TTFT.P90, t.TTFT.P99, t.TTFT.Max)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w, "(TTFT in ms, from just before a stream's dial to its first data: event)")
	for _, t := range r.Targets {
		if len(t.ErrorKinds) == 0 {
			continue
		}
		kinds := make([]string, 0, len(t.ErrorKinds))
		for k, n := range t.ErrorKinds {
			kinds = append(kinds, fmt.Sprintf("%s: %d", k, n))
		}
		sort.Strings(kinds)
		fmt.Fprintf(w, "%s errors: %s\n", t.Name, strings.Join(kinds, ", "))
	}
	return nil
}

// arrival says how the ramp's streams arrive.
func (r *rampReport) arrival() string {
	if r.Rate > 0 {
		return fmt.Sprintf("arriving at %.0f a second", r.Rate)
	}
	return "released at once"
}

// rampBudgetLines holds the sidecar's TTFT p99 with the ramp's streams
// arriving at most nginx's (no line without both), the previous build's
// beside it where it ran.
func rampBudgetLines(r *rampReport) []budgetLine {
	if r == nil {
		return nil
	}
	var sc, ng, prev *rampTarget
	for i := range r.Targets {
		switch t := &r.Targets[i]; t.Name {
		case "sidecar":
			sc = t
		case "nginx":
			ng = t
		case "previous":
			prev = t
		}
	}
	if sc == nil || ng == nil {
		return nil
	}
	ratio := 0.0
	if ng.TTFT.P99 > 0 {
		ratio = sc.TTFT.P99 / ng.TTFT.P99
	}
	line := fmt.Sprintf("TTFT p99 while %d streams open (%s) ≤ nginx's: sidecar %.1f ms, nginx %.1f ms (%.2f×)",
		r.Streams, r.arrival(), sc.TTFT.P99, ng.TTFT.P99, ratio)
	if prev != nil {
		line += fmt.Sprintf("; previous build %.1f ms", prev.TTFT.P99)
	}
	if sc.Errors > 0 || sc.CutShort > 0 {
		line += fmt.Sprintf(" (sidecar: %d errors, %d cut short)", sc.Errors, sc.CutShort)
	}
	return []budgetLine{{line: line, met: sc.TTFT.P99 <= ng.TTFT.P99}}
}

// runRamp starts a slow engine and fresh proxies in front of it (logs in
// dir), runs the ramp through each in turn, and writes its table.
func runRamp(ctx context.Context, o Options, dir string, w io.Writer) (*rampReport, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	ports, err := freePorts(4)
	if err != nil {
		return nil, err
	}
	engine := ports[0]
	conns := fmt.Sprint(o.Ramp + 100)
	var procs []*proc
	defer func() {
		for _, p := range procs {
			p.stop()
		}
	}()
	launch := func(name, bin string, args ...string) error {
		p, err := start(dir, name, bin, args...)
		if err == nil {
			procs = append(procs, p)
		}
		return err
	}
	if err := launch("engine-ramp", filepath.Join(o.Bin, "engine-sim"), "--role", "decode", "--port", itoa(engine),
		"--model", "sim-model", "--prefill-us-per-token", "0", "--decode-us-per-token", "1000000",
		"--max-running", conns, "--log-level", "warn"); err != nil {
		return nil, err
	}
	type cand struct {
		name string
		port int
	}
	cands := []cand{{"direct", engine}}
	// The sidecar's flags, its pool as large as the streams (as the memory
	// run's).
	sidecarArgs := func(port int) []string {
		return []string{"--port", itoa(port), "--model-server-port", itoa(engine), "--log-level", "warn", "--max-idle-conns-per-host", conns}
	}
	if err := launch("sidecar-ramp", filepath.Join(o.Bin, "pd-sidecar"), sidecarArgs(ports[1])...); err != nil {
		return nil, err
	}
	cands = append(cands, cand{"sidecar", ports[1]})
	if o.Nginx != "" {
		p, err := startNginx(dir, o.Nginx, ports[2], engine)
		if err != nil {
			return nil, err
		}
		procs = append(procs, p)
		cands = append(cands, cand{"nginx", ports[2]})
	}
	if o.Previous != "" {
		if err := launch("previous-ramp", o.Previous, sidecarArgs(ports[3])...); err != nil {
			return nil, err
		}
		cands = append(cands, cand{"previous", ports[3]})
	}
	if err := waitHTTP(ctx, baseURL(engine)+"/health", 20*time.Second); err != nil {
		return nil, err
	}
	for _, c := range cands {
		if err := waitHTTP(ctx, baseURL(c.port)+"/v1/models", 20*time.Second); err != nil {
			return nil, fmt.Errorf("%s: %w", c.name, err)
		}
	}
	body := fmt.Appendf(nil, `{"model":"sim-model","messages":[{"role":"user","content":"ramp"}],"max_tokens":%d,"stream":true}`, rampTokens)
	rep := &rampReport{Streams: o.Ramp, Rate: o.RampRate}
	for _, c := range cands {
		fmt.Fprintf(os.Stderr, "  ramp: %d streams %s through %s...\n", o.Ramp, rep.arrival(), c.name)
		tctx, cancel := context.WithTimeout(ctx, rampTimeout)
		streams := rampOnce(tctx, hostPort(c.port), body, o.Ramp, o.RampRate)
		cancel()
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		rep.Targets = append(rep.Targets, summarizeRamp(c.name, streams))
		time.Sleep(time.Second) // let the engine see the streams end
	}
	return rep, writeRampTable(w, rep)
}

// rampOnce releases n streams to addr, each on its own connection, all at
// once or, with rate > 0, the i-th i/rate seconds after the first, and
// reads every one to its end (or ctx's).
func rampOnce(ctx context.Context, addr string, body []byte, n int, rate float64) []rampStream {
	req := fmt.Appendf(nil, "POST /v1/chat/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n",
		addr, len(body))
	req = append(req, body...)
	out := make([]rampStream, n)
	gate := make(chan struct{})
	var parked, done sync.WaitGroup
	parked.Add(n)
	done.Add(n)
	for i := range n {
		go func() {
			defer done.Done()
			parked.Done()
			<-gate
			if rate > 0 {
				t := time.NewTimer(time.Duration(float64(i) / rate * float64(time.Second)))
				select {
				case <-t.C:
				case <-ctx.Done():
					t.Stop()
				}
			}
			out[i] = rampStreamOnce(ctx, addr, req)
		}()
	}
	// Every goroutine is started and waits at the gate: all are released
	// together.
	parked.Wait()
	close(gate)
	done.Wait()
	return out
}

// rampStreamOnce sends one streaming request on a connection of its own
// and reads its events to the end: its TTFT from just before the dial to
// its first data: event, and whether it ended with data: [DONE].
func rampStreamOnce(ctx context.Context, addr string, req []byte) rampStream {
	var s rampStream
	start := time.Now()
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		s.err = "connect"
		return s
	}
	defer c.Close()
	// ctx's end ends every read and write.
	defer context.AfterFunc(ctx, func() { c.Close() })()
	if _, err := c.Write(req); err != nil {
		s.err = "write"
		return s
	}
	resp, err := http.ReadResponse(bufio.NewReaderSize(c, 4096), nil)
	if err != nil {
		s.err = "no response head"
		return s
	}
	if resp.StatusCode != http.StatusOK {
		s.err = fmt.Sprintf("status %d", resp.StatusCode)
		return s
	}
	br := bufio.NewReaderSize(resp.Body, 4096)
	rest := false // the line read is the rest of a line longer than the buffer
	for {
		line, err := br.ReadSlice('\n')
		full := errors.Is(err, bufio.ErrBufferFull)
		if err != nil && !full {
			if !s.first {
				s.err = "no first event"
			}
			return s
		}
		cont := rest
		rest = full
		if cont {
			continue
		}
		data, ok := bytes.CutPrefix(line, []byte("data: "))
		if !ok {
			continue
		}
		if !s.first {
			s.first, s.ttft = true, time.Since(start)
		}
		data = bytes.TrimRight(data, "\r\n")
		switch {
		case bytes.Equal(data, []byte("[DONE]")):
			s.done = true
			return s
		case bytes.HasPrefix(data, []byte(`{"error"`)):
			s.err = "error event"
			return s
		}
	}
}
