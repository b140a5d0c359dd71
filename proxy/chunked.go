package proxy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/connectors/nixlv2"
	"github.com/pd-sidecar/pd-sidecar/metrics"
	"github.com/pd-sidecar/pd-sidecar/proxy/clientconn"
	"github.com/pd-sidecar/pd-sidecar/proxy/upstream"
)

// Chunked decode (--decode-chunk-size N): the decode of a chat request runs
// as a series of non-streamed requests of at most N tokens to the local
// engine, each continuing the one assistant message the earlier ones made
// (continue_final_message: true, add_generation_prompt: false), stitched
// into one answer, JSON or SSE, with the usage summed. It applies, as in
// llm-d, to /v1/chat/completions requests decoded here: decoder-only ones
// (with or without a KV cache source), the decode leg of a nixlv2 split
// (only the first chunk carries the handoff's kv_transfer_params) and a
// local-prefill fallback; not to requests routed by
// x-data-parallel-host-port nor to the decode legs of other connectors.

// maxDecodeChunks bounds the chunks of one decode. A budget larger than
// maxDecodeChunks chunks gets larger chunks; a request with no budget ends
// after maxDecodeChunks chunks (finish_reason "length").
const maxDecodeChunks = 256

// chunkPlan is how a decode is cut.
type chunkPlan struct {
	size      int // tokens per chunk
	budget    int // tokens in all (0: no budget)
	minTokens int // the client's min_tokens, spread over the chunks
	hasMin    bool
	messages  string // the client's messages (a JSON array)
	empty     bool   // messages is an empty array
}

// decode runs the decode of body on the local engine: chunked when
// chunkPlanFor says so, else one request relayed as it comes (forward,
// whose contract it has).
func (r *request) decode(body []byte, remote bool) error {
	plan, ok := r.chunkPlanFor(body, remote)
	if !ok {
		return r.forward(body, remote)
	}
	return r.chunked(body, remote, plan)
}

// chunkPlanFor reports whether the decode of body is chunked, and how. A
// budget (max_completion_tokens, else max_tokens) of at most one chunk is
// one plain request; so is a request the stitching cannot represent (n > 1,
// logprobs, or a client's own continue_final_message), and one whose cap
// is not a positive integer (the engine refuses it, as unchunked).
func (r *request) chunkPlanFor(body []byte, remote bool) (chunkPlan, bool) {
	n := r.p.cfg.DecodeChunkSize
	if n <= 0 || r.api != connectors.APIChat || r.rc == nil ||
		(remote && r.p.conn.Name() != nixlv2.Name) ||
		len(r.rc.Request.Header.Peek(HeaderDataParallel)) > 0 {
		return chunkPlan{}, false
	}
	v := gjson.GetMany(connectors.Bytes(body), "max_completion_tokens", "max_tokens", "n", "logprobs",
		"continue_final_message", "min_tokens", "messages")
	budget := 0
	for _, lim := range v[:2] {
		switch {
		case lim.Type == gjson.Null:
			continue // absent, or null: no cap
		case lim.Type != gjson.Number || lim.Int() < 1:
			return chunkPlan{}, false // the engine's to refuse, as it would
		case budget == 0:
			budget = int(lim.Int())
		}
	}
	if (budget > 0 && budget <= n) || (v[2].Exists() && v[2].Int() != 1) || v[3].Bool() || v[4].Bool() || !v[6].IsArray() {
		return chunkPlan{}, false
	}
	size := n
	if budget > 0 && (budget+n-1)/n > maxDecodeChunks {
		size = (budget + maxDecodeChunks - 1) / maxDecodeChunks
	}
	return chunkPlan{
		size: size, budget: budget, minTokens: int(v[5].Int()), hasMin: v[5].Type == gjson.Number,
		messages: v[6].Raw, empty: len(v[6].Array()) == 0,
	}, true
}

// chunker is the state of one chunked decode.
type chunker struct {
	r      *request
	plan   chunkPlan
	orig   []byte // the decode's body
	remote bool   // the first chunk carries the handoff
	gauge  prometheus.Gauge

	chunks int             // chunk requests sent
	tokens int             // completion tokens so far
	text   strings.Builder // the assistant message so far
	last   chunkAnswer
	first  chunkAnswer
	ended  bool // the last chunk is in
}

// chunkAnswer is what the decode keeps of one chunk's answer.
type chunkAnswer struct {
	json    string // the whole answer
	text    string
	finish  string
	tokens  int
	prompt  int
	usage   string // the usage object (raw; "" when none)
	id      string
	model   string
	created int64
}

// chunkFailed is a chunk the engine answered with an error status: before
// the answer began it is the client's answer.
type chunkFailed struct {
	status      int
	contentType string
	body        []byte
}

func (e *chunkFailed) Error() string { return fmt.Sprintf("decode chunk answered %d", e.status) }
func (e *chunkFailed) Unwrap() error { return ErrDecodeFailed }

// chunked runs a chunked decode. Like forward it returns nil once the
// answer is written or streaming, an error only while the client has seen
// nothing (ErrKVLoadFailed when the first chunk of a split could not load
// the remote KV).
func (r *request) chunked(body []byte, remote bool, plan chunkPlan) error {
	phase := metrics.PhaseLocal
	if remote {
		phase = metrics.PhaseDecode
	}
	c := &chunker{r: r, plan: plan, orig: body, remote: remote, gauge: r.p.m.Inflight.WithLabelValues(phase)}
	c.gauge.Inc()
	r.decodeStarted(remote)
	for {
		if err := c.next(); err != nil {
			c.gauge.Dec()
			return c.failedBeforeAnswer(err)
		}
		if c.ended {
			break
		}
		if r.stream {
			if r.leftNow() {
				c.gauge.Dec()
				return c.failedBeforeAnswer(ErrClientGone)
			}
			c.beginStream()
			return nil
		}
	}
	c.gauge.Dec()
	c.done(metrics.ChunkedCompleted)
	if r.stream {
		r.rc.Response.Header.Set("Cache-Control", "no-cache")
		r.answer(r.mode, fasthttp.StatusOK, "text/event-stream", c.closeEvents(c.openEvent(nil)))
		return nil
	}
	r.answer(r.mode, fasthttp.StatusOK, "application/json", c.whole())
	return nil
}

// done counts and logs the decode's outcome.
func (c *chunker) done(outcome string) {
	r := c.r
	r.p.m.Chunked.Decodes.WithLabelValues(outcome).Inc()
	r.obs.Chunks = c.chunks
	r.logAt(zerolog.InfoLevel).Str("outcome", outcome).Int("chunks", c.chunks).Int("completion_tokens", c.tokens).
		Str("finish_reason", c.last.finish).Msg("chunked decode")
}

// failedBeforeAnswer ends a decode whose chunk failed before the client saw
// anything: an engine's error answer is passed on, other errors are the
// caller's to answer.
func (c *chunker) failedBeforeAnswer(err error) error {
	r := c.r
	var cf *chunkFailed
	switch {
	case errors.Is(err, ErrKVLoadFailed):
		c.done(metrics.ChunkedFallback)
		return err
	case r.gone() || errors.Is(err, ErrClientGone):
		c.done(metrics.ChunkedClientLeft)
		return err
	case errors.As(err, &cf):
		c.done(metrics.ChunkedFailed)
		r.logAt(zerolog.ErrorLevel).Int("chunk", c.chunks).Int("status", cf.status).Msg("decode chunk failed; the engine's error passed on")
		b := cf.body
		if !connectors.IsObject(b) {
			b = errorBody(cf.status, err)
		}
		r.answer(r.mode, cf.status, "application/json", b)
		return nil
	}
	c.done(metrics.ChunkedFailed)
	return err
}

// next runs the next chunk and adds its answer.
func (c *chunker) next() error {
	r := c.r
	first := c.chunks == 0
	body, err := c.body()
	if err != nil {
		return fmt.Errorf("%w: %w", ErrBadRequest, err)
	}
	c.chunks++
	r.p.m.Chunked.Chunks.Inc()
	req := r.upstream(r.local, body)
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseResponse(resp)
	sent := time.Now()
	hold, err := r.p.tr.Do(r.ctx, r.local, req, resp)
	fasthttp.ReleaseRequest(req)
	if err != nil {
		return decodeTransportErr(err)
	}
	defer hold.Release()
	st := resp.StatusCode()
	if c.remote && first {
		r.kvHandoffDone(sent, st == fasthttp.StatusOK)
		if st == fasthttp.StatusInternalServerError && r.kvLoadFailed() {
			return ErrKVLoadFailed
		}
	}
	if st != fasthttp.StatusOK {
		return &chunkFailed{status: st, contentType: string(resp.Header.ContentType()), body: append([]byte(nil), resp.Body()...)}
	}
	buf := resp.Body()
	if c.remote && first && r.p.rewriter != nil {
		buf = r.p.rewriter.RewriteAnswer(r.api, buf, *r.handoff)
	}
	a, err := parseChunk(buf)
	if err != nil {
		return err
	}
	c.add(a)
	return nil
}

// parseChunk reads a chunk's 200 answer.
func parseChunk(buf []byte) (chunkAnswer, error) {
	js := string(buf) // a copy: the response is let go
	if !gjson.Valid(js) {
		return chunkAnswer{}, fmt.Errorf("%w: a decode chunk's answer is not JSON", upstream.ErrBadUpstreamAnswer)
	}
	v := gjson.GetMany(js, "choices.0", "usage", "id", "model", "created")
	if !v[0].IsObject() {
		return chunkAnswer{}, fmt.Errorf("%w: a decode chunk's answer has no choices[0]", upstream.ErrBadUpstreamAnswer)
	}
	a := chunkAnswer{
		json: js, text: v[0].Get("message.content").String(), finish: v[0].Get("finish_reason").String(),
		tokens: int(v[1].Get("completion_tokens").Int()), prompt: int(v[1].Get("prompt_tokens").Int()),
		id: v[2].String(), model: v[3].String(), created: v[4].Int(),
	}
	if v[1].IsObject() {
		a.usage = v[1].Raw
	}
	return a, nil
}

// add takes in a chunk's answer and decides whether the decode ended: on a
// terminal finish_reason, an empty chunk, the budget spent or the last
// chunk allowed.
func (c *chunker) add(a chunkAnswer) {
	if c.chunks == 1 {
		c.first = a
	}
	c.last = a
	c.text.WriteString(a.text)
	c.tokens += a.tokens
	c.ended = (a.finish != "" && a.finish != "length") || (a.tokens == 0 && a.text == "") ||
		(c.plan.budget > 0 && c.tokens >= c.plan.budget) || c.chunks >= maxDecodeChunks
}

// body is the next chunk's request: the decode's body asking for at most a
// chunk of tokens, not streamed; from the second chunk on, without
// kv_transfer_params and continuing the assistant message made so far.
func (c *chunker) body() ([]byte, error) {
	k := c.plan.size
	if c.plan.budget > 0 {
		k = min(k, c.plan.budget-c.tokens)
	}
	kb := strconv.AppendInt(nil, int64(k), 10)
	edits := []connectors.Edit{
		{Key: "stream", Raw: []byte("false")},
		{Key: "stream_options", Delete: true},
		{Key: "max_tokens", Raw: kb},
		{Key: "max_completion_tokens", Raw: kb},
	}
	if c.plan.hasMin {
		edits = append(edits, connectors.Edit{Key: "min_tokens", Raw: strconv.AppendInt(nil, int64(min(max(c.plan.minTokens-c.tokens, 0), k)), 10)})
	}
	if c.chunks > 0 {
		edits = append(edits,
			connectors.Edit{Key: "kv_transfer_params", Delete: true},
			connectors.Edit{Key: "continue_final_message", Raw: []byte("true")},
			connectors.Edit{Key: "add_generation_prompt", Raw: []byte("false")},
			connectors.Edit{Key: "messages", Raw: c.messages()},
		)
	}
	return connectors.EditObject(nil, c.orig, edits)
}

// messages is the client's messages with the one assistant message made
// so far at the end.
func (c *chunker) messages() []byte {
	m := c.plan.messages
	b := make([]byte, 0, len(m)+c.text.Len()+48)
	b = append(b, m[:strings.LastIndexByte(m, ']')]...)
	if !c.plan.empty {
		b = append(b, ',')
	}
	b = append(b, `{"role":"assistant","content":`...)
	b = appendJSONString(b, c.text.String())
	return append(b, "}]"...)
}

// usage is the decode's usage: the first chunk's (its prompt tokens and
// details) with the completion tokens of all chunks.
func (c *chunker) usage() []byte {
	prompt := c.first.prompt
	ct := strconv.AppendInt(nil, int64(c.tokens), 10)
	tt := strconv.AppendInt(nil, int64(prompt+c.tokens), 10)
	if c.first.usage != "" {
		if u, err := connectors.EditObject(nil, []byte(c.first.usage), []connectors.Edit{
			{Key: "completion_tokens", Raw: ct}, {Key: "total_tokens", Raw: tt},
		}); err == nil {
			return u
		}
	}
	return fmt.Appendf(nil, `{"prompt_tokens":%d,"completion_tokens":%s,"total_tokens":%s}`, prompt, ct, tt)
}

// whole is the JSON answer: the last chunk's, with its first choice holding
// the whole message and the usage summed.
func (c *chunker) whole() []byte {
	content := appendJSONString(nil, c.text.String())
	choice, err := connectors.EditObject(nil, []byte(gjson.Get(c.last.json, "choices.0").Raw), []connectors.Edit{
		{Key: "message", Nested: []connectors.Edit{{Key: "content", Raw: content}}},
	})
	if err != nil {
		choice = []byte(gjson.Get(c.last.json, "choices.0").Raw)
	}
	choices := append(append([]byte{'['}, choice...), ']')
	out, err := connectors.EditObject(nil, []byte(c.last.json), []connectors.Edit{
		{Key: "choices", Raw: choices}, {Key: "usage", Raw: c.usage()},
	})
	if err != nil {
		return []byte(c.last.json)
	}
	return out
}

// event appends one chat.completion.chunk event of the decode: a delta
// (role and/or content) or, with finish, the closing choice; usage, when
// set, makes it the usage chunk (no choices).
func (c *chunker) event(b []byte, role bool, content string, finish string, usage []byte) []byte {
	b = append(b, `data: {"id":`...)
	b = appendJSONString(b, c.first.id)
	b = append(b, `,"object":"chat.completion.chunk","created":`...)
	b = strconv.AppendInt(b, c.first.created, 10)
	b = append(b, `,"model":`...)
	b = appendJSONString(b, c.first.model)
	if usage != nil {
		b = append(b, `,"choices":[],"usage":`...)
		b = append(b, usage...)
		return append(b, "}\n\n"...)
	}
	b = append(b, `,"choices":[{"index":0,"delta":{`...)
	sep := ""
	if role {
		b = append(b, `"role":"assistant"`...)
		sep = ","
	}
	if content != "" || role {
		b = append(b, sep...)
		b = append(b, `"content":`...)
		b = appendJSONString(b, content)
	}
	b = append(b, `},"logprobs":null,"finish_reason":`...)
	if finish == "" {
		b = append(b, "null"...)
	} else {
		b = appendJSONString(b, finish)
	}
	return append(b, "}]}\n\n"...)
}

// openEvent appends the stream's first event: the role and the first
// chunk's text.
func (c *chunker) openEvent(b []byte) []byte { return c.event(b, true, c.first.text, "", nil) }

// closeEvents appends the stream's end: the finish_reason, the usage chunk
// when the client asked for it, [DONE].
func (c *chunker) closeEvents(b []byte) []byte {
	b = c.event(b, false, "", c.last.finish, nil)
	if c.r.usage {
		b = c.event(b, false, "", "", c.usage())
	}
	return append(b, "data: [DONE]\n\n"...)
}

// beginStream answers 200 with an event stream that carries the first
// chunk's text now and each further chunk's as it comes (chunkStream).
func (c *chunker) beginStream() {
	r := c.r
	rc := r.rc
	rc.SetStatusCode(fasthttp.StatusOK)
	rc.SetContentType("text/event-stream")
	rc.Response.Header.Set("Cache-Control", "no-cache")
	r.answerCounted(r.mode, fasthttp.StatusOK)
	s := &chunkStream{c: c, buf: c.openEvent(nil)}
	if r.watch.Stop() {
		rc.SetConnectionClose()
	}
	r.detached = true
	setStream(rc, s) // conformance.go
}

// chunkStream is the body of a streamed chunked decode: fasthttp's server
// goroutine reads it and writes (and flushes) each Read, so each chunk's
// text leaves as soon as it is in. While a chunk runs the client connection
// is watched, and a client that leaves cancels it.
type chunkStream struct {
	c         *chunker
	buf       []byte
	off       int
	ended     bool // the stream's last event is in buf
	outcome   string
	pipelined bool // a watch took a byte of a pipelined request
	closed    bool
}

// Read implements io.Reader.
func (s *chunkStream) Read(p []byte) (int, error) {
	for s.off == len(s.buf) {
		if s.ended {
			return 0, io.EOF
		}
		if err := s.step(); err != nil {
			return 0, err
		}
	}
	n := copy(p, s.buf[s.off:])
	s.off += n
	return n, nil
}

// step runs the next chunk and puts its events in buf: its text, and the
// stream's end when the decode ended; or, when the chunk failed, an error
// event and [DONE]. It fails only when the client left.
func (s *chunkStream) step() error {
	c, r := s.c, s.c.r
	s.buf, s.off = s.buf[:0], 0
	release := clientconn.Hold(r.rc) // the handler returned: the watch's read is no request boundary
	w := r.p.armer.Watch(r.rc.Conn(), r.cancel, time.Now())
	err := c.next()
	s.pipelined = w.Stop() || s.pipelined
	release()
	switch {
	case r.gone() || errors.Is(err, ErrClientGone):
		s.outcome = metrics.ChunkedClientLeft
		return ErrClientGone
	case err != nil:
		s.outcome, s.ended = metrics.ChunkedFailed, true
		r.logAt(zerolog.ErrorLevel).Err(err).Int("chunk", c.chunks).Msg("decode chunk failed mid-stream; the stream ends with an error event")
		s.buf = append(s.buf, "data: "...)
		s.buf = append(s.buf, streamErrorBody(err)...)
		s.buf = append(s.buf, "\n\ndata: [DONE]\n\n"...)
		return nil
	}
	if c.last.text != "" {
		s.buf = c.event(s.buf, false, c.last.text, "", nil)
	}
	if c.ended {
		s.outcome, s.ended = metrics.ChunkedCompleted, true
		s.buf = c.closeEvents(s.buf)
	}
	return nil
}

// streamErrorBody is the error object of a failed chunk's event: the
// engine's own error object when it sent one, else the sidecar's.
func streamErrorBody(err error) []byte {
	var cf *chunkFailed
	if errors.As(err, &cf) {
		if b := bytes.TrimSpace(cf.body); connectors.IsObject(b) && gjson.ValidBytes(b) {
			return b
		}
		return errorBody(cf.status, err)
	}
	return errorBody(classify(err).status, err)
}

// Close implements io.Closer; fasthttp calls it once the body is written or
// a client write failed. It ends the decode and the request.
func (s *chunkStream) Close() error {
	if s.closed {
		return nil
	}
	s.closed = true
	c, r := s.c, s.c.r
	if !s.ended || s.off < len(s.buf) {
		s.outcome = metrics.ChunkedClientLeft
		r.left()
	}
	c.gauge.Dec()
	c.done(s.outcome)
	if s.pipelined {
		// A watch took the first byte of the client's next request: the
		// connection cannot serve it; the client sends it again.
		_ = r.rc.Conn().Close()
	}
	r.finish()
	return nil
}
