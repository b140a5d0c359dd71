package core

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/hex"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"time"

	"github.com/rs/zerolog"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/metrics"
	"github.com/pd-sidecar/pd-sidecar/proxy/chunked"
	"github.com/pd-sidecar/pd-sidecar/proxy/feature"
	"github.com/pd-sidecar/pd-sidecar/proxy/logvalue"
	"github.com/pd-sidecar/pd-sidecar/proxy/observe"
	"github.com/pd-sidecar/pd-sidecar/proxy/sse"
	"github.com/pd-sidecar/pd-sidecar/proxy/upstream"
)

// Request is the state of one inference request. It is owned by the
// handler goroutine and, once the answer is streamed, by the body writer.
type Request struct {
	P      *Sidecar
	Ctx    context.Context
	Cancel context.CancelCauseFunc
	ID     string
	// log is the request's logger (request_id, path, prefiller fields),
	// built on first use: see LogAt.
	log      zerolog.Logger
	logReady bool
	Start    time.Time
	API      connectors.API
	// Local is the engine of the decode legs: the rank's whose port the
	// request arrived on (home), or the one x-data-parallel-host-port names.
	Local  string
	Home   string
	Body   []byte
	Stream bool
	Usage  bool // stream_options.include_usage

	Prefiller string // host:port chosen from the header ("" = none)
	named     bool   // the request carried x-prefiller-host-port
	// uses are the request features' parts in the request (proxy/feature).
	uses feature.Uses
	// session is the conversation's session key, with multi-turn KV
	// reuse on ("": none named).
	session string
	// Client is the client connection's TCP peer (Arrival.Client; the
	// zero Addr: unknown).
	Client   netip.Addr
	Label    string // bounded metric label of prefiller
	Mode     string
	Handoff  *connectors.Handoff // set once the decode leg carries remote KV
	Detached bool                // the body writer owns the request now
	// OnOutput, when set, is told the moment the decode leg's first output
	// is seen (before it is relayed): the concurrent choreography's point of
	// no return.
	OnOutput func()
	// adm is the request's admission under way (Admit).
	adm admitting
	// prefillRank is the x-data-parallel-rank of the prefill leg alone
	// ("" = none): the rank a concurrent connector paired the legs on
	// (connectors.PrefillRanker; Mooncake with a data-parallel prefiller).
	prefillRank string
	// dpRouted: x-data-parallel-host-port picked the rank (dprank.Picker).
	dpRouted bool
	Obs      observe.Report // what its report says
	// trace is the request's trace (feature.RequestTracer's); nil: the
	// request is not traced.
	trace feature.Trace
	// held is the buffer budget's share of the answers read whole that
	// the request keeps until it finishes (a prefill answer's copy).
	held upstream.AnswerHold
	// KVPending is the prefill's handoff while the decode engine has not
	// read its KV: set when the prefill answer is parsed, cleared by the
	// decode leg's first output or KV load failure (awaitKVRead).
	KVPending *connectors.Handoff
}

// hopHeaders are connection-scoped and never forwarded.
var HopHeaders = []string{
	"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade",
}

// Arrival is what a driver knows of an inference request as it begins:
// the facts the request's state starts from.
type Arrival struct {
	// ID is the client's X-Request-ID (nil: none; one is made).
	ID []byte
	// Head is the client's head, read for its trace context while the
	// request begins.
	Head feature.TraceHead
	// Body is the client's body.
	Body []byte
	// Local is the engine that decodes it: its data-parallel rank's.
	Local string
	// API is the inference API of its path.
	API connectors.API
	// Client is the client connection's TCP peer (the zero Addr: unknown).
	Client netip.Addr
}

// StartRequest begins the state of request a, as fasthttp's path
// (relay.NewExchange) and the lane share it.
func (p *Sidecar) StartRequest(a Arrival) *Request {
	ctx, cancel := context.WithCancelCause(context.Background())
	r := &Request{
		P: p, Ctx: ctx, Cancel: cancel, Start: time.Now(), Client: a.Client,
		API: a.API, Local: a.Local, Home: a.Local, Body: a.Body, Mode: metrics.ModeLocal,
	}
	r.ID = RequestID(a.ID)
	// r.Stream and r.Usage: read by sanitize.Cleaner, in its pass over the body.
	r.traceStart(a.Head)
	return r
}

// LogAt returns an event of level l on the request's logger, or nil (a
// no-op event) when l is not logged; the logger, with the request's fields,
// is built only for the first event logged, so a request that logs nothing
// allocates nothing for it.
func (r *Request) LogAt(l zerolog.Level) *zerolog.Event {
	if l < r.P.Log.GetLevel() || l < zerolog.GlobalLevel() {
		return nil
	}
	return r.Logger().WithLevel(l)
}

// Logger returns the request's logger, building it when needed.
func (r *Request) Logger() *zerolog.Logger {
	if !r.logReady {
		c := r.P.Log.With().Str("request_id", r.ID).Str("path", r.API.String())
		if r.Prefiller != "" {
			c = c.Str("prefiller", logvalue.Cut(r.Prefiller))
		}
		r.log = c.Logger()
		r.logReady = true
	}
	return &r.log
}

// Finish ends the request's bookkeeping; the last owner calls it, once
// the driver released a handoff still pending a read (ReleaseKV).
func (r *Request) Finish() {
	r.held.Release()
	r.Report()
	r.P.Guard.Release()
	r.Cancel(context.Canceled)
}

// Keep moves h's reservation to the request, released when it finishes.
func (r *Request) Keep(h *upstream.AnswerHold) { r.held.Add(h.Take()) }

// Gone reports whether the client left.
func (r *Request) Gone() bool { return context.Cause(r.Ctx) == ErrClientGone }

// ChunkPlan reports whether the decode of body on the local engine
// (remote: a split's, on the prefill's KV) is chunked, and how: as the
// request's part of chunked decode says (chunked.Feature), when it has one.
func (r *Request) ChunkPlan(body []byte, remote bool) (chunked.Plan, bool) {
	for u := range r.uses.All() {
		if p, ok := u.(chunked.Planner); ok {
			return p.ChunkPlan(body, remote)
		}
	}
	return chunked.Plan{}, false
}

// ChunkJob is the chunked decode of body by plan (ChunkPlan), its gauge
// the in-flight decodes of its phase. Its JSON answer, made of the last
// chunk's, goes through LocalAnswerEdit, split or local: no split's
// AnswerEdit follows a chunked decode.
func (r *Request) ChunkJob(plan chunked.Plan, body []byte, remote bool) chunked.Job {
	phase := metrics.PhaseLocal
	if remote {
		phase = metrics.PhaseDecode
	}
	return chunked.Job{Plan: plan, Body: body, Stream: r.Stream, Usage: r.Usage, Remote: remote,
		Inflight: r.P.M.Inflight.WithLabelValues(phase), Edit: r.LocalAnswerEdit()}
}

// pickPrefiller chooses one entry of the header value: the first, or a
// random one with --enable-prefiller-sampling.
func pickPrefiller(v []byte, sampling bool) (string, error) {
	n := bytes.Count(v, []byte{','}) + 1
	i := 0
	if sampling && n > 1 {
		i = rand.IntN(n)
	}
	for k := 0; k < i; k++ {
		v = v[bytes.IndexByte(v, ',')+1:]
	}
	if j := bytes.IndexByte(v, ','); j >= 0 {
		v = v[:j]
	}
	hp := string(bytes.TrimSpace(v))
	host, port, err := net.SplitHostPort(hp)
	if err != nil || host == "" {
		return hp, ErrBadPrefiller
	}
	if n, err := strconv.Atoi(port); err != nil || n <= 0 || n > 65535 {
		return hp, ErrBadPrefiller
	}
	return hp, nil
}

// requestID keeps a valid incoming id, else makes one.
func RequestID(in []byte) string {
	if validID(in) {
		return string(in)
	}
	// 128 random bits from the runtime's per-thread ChaCha8 generator: unique
	// enough for a request id, and no getrandom syscall per request.
	var b [16]byte
	binary.LittleEndian.PutUint64(b[:8], rand.Uint64())
	binary.LittleEndian.PutUint64(b[8:], rand.Uint64())
	return hex.EncodeToString(b[:])
}

func validID(b []byte) bool {
	if len(b) == 0 || len(b) > 128 {
		return false
	}
	for _, c := range b {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
			c == '-' || c == '_' || c == '.' || c == ':'
		if !ok {
			return false
		}
	}
	return true
}

// strHTTP11 is every leg's version, whatever the client's.
var StrHTTP11 = []byte("HTTP/1.1")

// The request features (proxy/feature) take part in a request at the
// points both drivers pass through: beginFeatures (in Admit) once the
// prefiller is named and allowed, none is named, or the one named is
// refused; then the parts they took (feature.Uses) edit the prefill or
// local body, the answer, and name a KV cache source. They are asked in
// the order of the one list NewSidecar registers them in (Sidecar.features).

// beginFeatures asks every feature for its part in r, whose head is h
// (refused: the prefiller r names is refused, and r falls back). A feature
// that declines the split is counted and reported here, and the request is
// then served in mode local.
func (r *Request) beginFeatures(h feature.Head, refused bool) {
	if len(r.P.features) == 0 {
		return
	}
	fr := feature.Request{API: r.API, Body: r.Body, Port: r.P.Cfg.Port + r.rank(), Refused: refused, Log: r, ID: r.ID, Local: r.Local}
	if !refused {
		fr.Prefiller, fr.Session, fr.Client, fr.Label = r.Prefiller, r.session, r.Client, r.Label
	}
	fr.Routed = r.dpRouted
	if reason := r.uses.Begin(r.P.features, fr, h); reason != "" {
		r.P.M.SplitDeclined.WithLabelValues(reason).Inc()
		r.Obs.Declined = reason
		r.Mode = metrics.ModeLocal
	}
}

// AnswerEdit returns the edit of each piece of the split's decode answer
// (the whole JSON body, or one SSE event's data): the connector's rewrite
// with the handoff, then every feature's (feature.AnswerEditor); nil when
// nothing edits it. Both drivers relay the decode leg's answer through it.
func (r *Request) AnswerEdit() func([]byte) []byte {
	edit := r.uses.AnswerEdit()
	rw, h := r.P.Rewriter, r.Handoff
	if rw == nil || h == nil {
		return edit
	}
	api := r.API
	return func(d []byte) []byte {
		d = rw.RewriteAnswer(api, d, *h)
		if edit != nil {
			d = edit(d)
		}
		return d
	}
}

// LocalAnswerEdit returns the edit of each piece of the answer of a
// request the local engine served without a split's KV (the whole JSON
// body, or one SSE event's data): every feature's
// (feature.LocalAnswerEditor); nil when nothing edits it. Both drivers
// relay such answers through it.
func (r *Request) LocalAnswerEdit() func([]byte) []byte { return r.uses.LocalAnswerEdit() }

// IsOutput reports whether a decode leg's answer read whole, of status,
// is the leg's output (a 200), as KVAnswered takes it.
func IsOutput(status int) bool { return status == http.StatusOK }

// AnswerBody returns the decode leg's answer read whole, of status, as
// AnswerEdit edits it (a 200's; buf itself when nothing edits it).
func (r *Request) AnswerBody(status int, buf []byte) []byte {
	if !IsOutput(status) {
		return buf
	}
	if ed := r.AnswerEdit(); ed != nil {
		return ed(buf)
	}
	return buf
}

// ChunkAnswer returns a chunked decode's piece read whole, of status: the
// connector's cached-tokens rewrite of a 200 that carried the split's
// handoff (handoff), buf itself otherwise.
func (r *Request) ChunkAnswer(status int, buf []byte, handoff bool) []byte {
	if status != http.StatusOK || !handoff || r.P.Rewriter == nil {
		return buf
	}
	return r.P.Rewriter.RewriteAnswer(r.API, buf, *r.Handoff)
}

// LocalAnswerBody returns a local answer's body read whole, of status,
// as LocalAnswerEdit edits it (a 200's; buf itself when nothing edits it).
func (r *Request) LocalAnswerBody(status int, buf []byte) []byte {
	if ed := r.LocalAnswerEdit(); status == http.StatusOK && ed != nil {
		return ed(buf)
	}
	return buf
}

// EditLocal gives the body of a request served locally to every feature
// that edits it.
func (r *Request) EditLocal(body []byte) ([]byte, error) { return r.uses.EditLocal(body) }

// rank is the data-parallel rank r arrived on (its home engine's).
func (r *Request) rank() int {
	_, port, _ := net.SplitHostPort(r.Home)
	n, _ := strconv.Atoi(port)
	return n - r.P.Cfg.ModelServerPort
}

// EventRefused counts and logs a stream of the local engine refused for an
// event past the bound. It may run on any goroutine (a hedge's local leg
// is read beside the request's), so it logs with the request id, not
// through the request's own logger.
func (r *Request) EventRefused() {
	r.P.M.Upstream.Refused.WithLabelValues(metrics.UpstreamEngine, metrics.RefusedEventTooLong).Inc()
	r.P.Log.Error().Str("request_id", r.ID).Str("upstream", metrics.UpstreamEngine).Str("reason", metrics.RefusedEventTooLong).
		Int("max_sse_event_bytes", sse.Bound(r.P.Cfg.MaxSSEEventBytes)).
		Msg("upstream SSE event longer than --max-sse-event-bytes: stream refused, upstream connection closed")
}
