package loadgen

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"
	"github.com/valyala/fasthttp"
)

// Target is one endpoint to measure.
type Target struct {
	// Name labels the target in reports.
	Name string
	// URL is the base URL (scheme, host, port) requests go to.
	URL string
	// PrefillURL, when set, makes pd-bench run the nixlv2 prefill leg itself
	// against it and then the decode leg against URL, with no proxy in
	// between: the floor of any P/D proxy.
	PrefillURL string
	// Prefiller, when set, is sent as x-prefiller-host-port.
	Prefiller string
}

// Result is what one request saw.
type Result struct {
	// Start is when the request was due (open loop) or sent (closed loop);
	// latencies count from it.
	Start time.Time
	// TTFT is the time to the first generated token (the whole answer for
	// non-streaming requests).
	TTFT time.Duration
	// Gaps are the inter-token gaps of a stream.
	Gaps []time.Duration
	// Latency is the end-to-end time.
	Latency time.Duration
	// Tokens is the number of generated tokens seen.
	Tokens int
	// Status is the HTTP status (0 when none arrived).
	Status int
	// BodyBytes is the size of the request body the client sent (for a
	// floor target, the client's body, not the legs').
	BodyBytes int
	// Err is empty on success, else a short error kind.
	Err string
	// Left marks a request whose client closed its connection on purpose
	// before the answer ended (Load.LeaveShare); Err is then empty, and
	// Status and Tokens say what had arrived before it left (Status 0:
	// not even the answer's head).
	Left bool
}

// Error kinds of a Result.
const (
	ErrKindConnect  = "connect"
	ErrKindStatus   = "status"
	ErrKindCut      = "cut short"
	ErrKindEvent    = "error event"
	ErrKindBadReply = "bad reply"
)

// client sends requests for one target.
type client struct {
	t       Target
	api     API
	hc      *fasthttp.Client
	url     string
	timeout time.Duration
}

func newClient(t Target, api API, timeout time.Duration) *client {
	return &client{
		t:       t,
		api:     api,
		url:     t.URL + api.Path(),
		timeout: timeout,
		hc:      newHTTPClient(timeout, nil),
	}
}

// newHTTPClient is the fasthttp client of a target; dial nil is
// fasthttp's own.
func newHTTPClient(timeout time.Duration, dial fasthttp.DialFunc) *fasthttp.Client {
	return &fasthttp.Client{
		Dial:                dial,
		StreamResponseBody:  true,
		MaxConnsPerHost:     1 << 16,
		MaxIdleConnDuration: 30 * time.Second,
		ReadTimeout:         timeout,
		WriteTimeout:        timeout,
		ReadBufferSize:      16 << 10,
	}
}

// leave runs one request whose client closes its connection at the time
// at unless the answer ended before: a client that gives up. fasthttp has
// no per-request cancellation, so the request gets a client of its own
// whose dialer keeps the connection, and a timer closes it; the server
// sees the connection end as it would when a real client goes away.
func (c *client) leave(start time.Time, body []byte, at time.Time) Result {
	var (
		mu   sync.Mutex
		conn net.Conn
		gone bool // the timer fired: no connection may be made any more
	)
	dial := func(addr string) (net.Conn, error) {
		mu.Lock()
		defer mu.Unlock()
		if gone {
			return nil, errors.New("the client has left")
		}
		nc, err := fasthttp.DialTimeout(addr, c.timeout)
		if err != nil {
			return nil, fmt.Errorf("dial %s: %w", addr, err)
		}
		conn = nc
		return nc, nil
	}
	one := *c
	one.hc = newHTTPClient(c.timeout, dial)
	defer one.hc.CloseIdleConnections()
	timer := time.AfterFunc(time.Until(at), func() {
		mu.Lock()
		defer mu.Unlock()
		gone = true
		if conn != nil {
			_ = conn.Close()
		}
	})
	r := one.do(start, body)
	fired := !timer.Stop()
	// A timer that fired as the answer ended closed an idle connection:
	// that client got its whole answer and did not leave.
	if fired && r.Err != "" {
		r.Left, r.Err = true, ""
	}
	return r
}

var prefillParams = []byte(`{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}`)

// do runs one request (two legs for a floor target).
func (c *client) do(start time.Time, body []byte) Result {
	r := Result{Start: start, BodyBytes: len(body)}
	if c.t.PrefillURL != "" {
		decodeBody, err := c.prefill(body)
		if err != nil {
			r.Err = err.Error()
			r.Latency = time.Since(start)
			return r
		}
		body = decodeBody
	}
	c.send(&r, c.url, body, c.t.Prefiller)
	return r
}

// prefill runs the nixlv2 prefill leg and returns the decode body.
func (c *client) prefill(body []byte) ([]byte, error) {
	pb, _ := sjson.SetBytes(body, "max_tokens", 1)
	pb, _ = sjson.SetBytes(pb, "stream", false)
	pb, _ = sjson.DeleteBytes(pb, "stream_options")
	pb, _ = sjson.SetRawBytes(pb, "kv_transfer_params", prefillParams)
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(c.t.PrefillURL + c.api.Path())
	req.Header.SetMethod(fasthttp.MethodPost)
	req.Header.SetContentType("application/json")
	req.SetBody(pb)
	if err := c.hc.Do(req, resp); err != nil {
		return nil, errors.New(ErrKindConnect)
	}
	b, err := readAllStream(resp)
	if err != nil || resp.StatusCode() != fasthttp.StatusOK {
		return nil, fmt.Errorf("%s %d", ErrKindStatus, resp.StatusCode())
	}
	kv := gjson.GetBytes(b, "kv_transfer_params")
	if !kv.IsObject() {
		return nil, errors.New(ErrKindBadReply)
	}
	return sjson.SetRawBytes(append([]byte{}, body...), "kv_transfer_params", []byte(kv.Raw))
}

func readAllStream(resp *fasthttp.Response) ([]byte, error) {
	if s := resp.BodyStream(); s != nil {
		b, err := io.ReadAll(s)
		_ = resp.CloseBodyStream()
		return b, err
	}
	return resp.Body(), nil
}

var (
	dataPrefix = []byte("data: ")
	doneData   = []byte("[DONE]")
	roleField  = []byte(`"role"`)
	emptyList  = []byte(`"choices":[]`)
	errorField = []byte(`{"error"`)
)

func (c *client) send(r *Result, url string, body []byte, prefiller string) {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(url)
	req.Header.SetMethod(fasthttp.MethodPost)
	req.Header.SetContentType("application/json")
	if prefiller != "" {
		req.Header.Set("x-prefiller-host-port", prefiller)
	}
	req.SetBodyRaw(body)
	if err := c.hc.Do(req, resp); err != nil {
		r.Err = ErrKindConnect
		r.Latency = time.Since(r.Start)
		return
	}
	r.Status = resp.StatusCode()
	defer func() { r.Latency = time.Since(r.Start) }()
	if r.Status != fasthttp.StatusOK {
		_, _ = readAllStream(resp)
		r.Err = fmt.Sprintf("%s %d", ErrKindStatus, r.Status)
		return
	}
	if !bytes.HasPrefix(resp.Header.ContentType(), []byte("text/event-stream")) {
		b, err := readAllStream(resp)
		if err != nil {
			r.Err = ErrKindCut
			return
		}
		r.TTFT = time.Since(r.Start)
		r.Tokens = int(gjson.GetBytes(b, "usage.completion_tokens").Int())
		return
	}
	c.readStream(r, resp)
}

// readStream reads SSE events, timing each generated token.
func (c *client) readStream(r *Result, resp *fasthttp.Response) {
	stream := resp.BodyStream()
	defer func() { _ = resp.CloseBodyStream() }()
	br := bufio.NewReaderSize(stream, 16<<10)
	last := time.Time{}
	for {
		line, err := br.ReadSlice('\n')
		if err != nil {
			if errors.Is(err, bufio.ErrBufferFull) {
				// A long event: skip the rest of the line, count it as data.
				for errors.Is(err, bufio.ErrBufferFull) {
					_, err = br.ReadSlice('\n')
				}
				continue
			}
			r.Err = ErrKindCut
			return
		}
		data, ok := bytes.CutPrefix(line, dataPrefix)
		if !ok {
			continue
		}
		data = bytes.TrimRight(data, "\r\n")
		switch {
		case bytes.Equal(data, doneData):
			// Read the chunked terminator too, so the connection is kept
			// alive instead of being closed half-read.
			_, _ = io.Copy(io.Discard, br)
			return
		case bytes.HasPrefix(data, errorField):
			r.Err = ErrKindEvent
		case bytes.Contains(data, roleField) || bytes.Contains(data, emptyList):
			// the role chunk, or the usage chunk: no token
		default:
			now := time.Now()
			if r.Tokens == 0 {
				r.TTFT = now.Sub(r.Start)
			} else {
				r.Gaps = append(r.Gaps, now.Sub(last))
			}
			last = now
			r.Tokens++
		}
	}
}

// Client sends single requests to one target, for a benchmark that times
// requests one by one (Run drives load).
type Client struct{ c *client }

// NewClient returns a Client for t; timeout bounds each request's reads and
// writes.
func NewClient(t Target, api API, timeout time.Duration) *Client {
	return &Client{c: newClient(t, api, timeout)}
}

// Send runs one request and returns what it saw. A ctx that has ended
// sends nothing (the Result's Err is "canceled"); fasthttp takes no
// context, so a request already sent runs to its end or its timeout.
func (c *Client) Send(ctx context.Context, body []byte) Result {
	if ctx.Err() != nil {
		return Result{Start: time.Now(), Err: "canceled"}
	}
	return c.c.do(time.Now(), body)
}

// Close closes the client's idle connections.
func (c *Client) Close() { c.c.hc.CloseIdleConnections() }
