package core

import (
	"time"

	"github.com/pd-sidecar/pd-sidecar/failure"
	"go.opentelemetry.io/otel/trace"

	"github.com/pd-sidecar/pd-sidecar/metrics"
	"github.com/pd-sidecar/pd-sidecar/proxy/feature"
)

// RequestReport is how one inference request ended, as told to an Observer.
type RequestReport struct {
	// ID is the request id (X-Request-ID).
	ID string
	// Mode is metrics.ModeDisaggregated, ModeLocal or ModeFallback.
	Mode string
	// Reason is the fallback reason ("" when the request did not degrade).
	Reason string
	// Prefiller is the bounded metric label of the named prefiller ("" when
	// the request named none, or none that could be used).
	Prefiller string
	// Declined is why the sidecar served a request that named a prefiller
	// locally by choice, with no prefill leg (metrics.Decline*);
	// "" when it did not decline. Such a request is in Mode local, and no
	// fallback.
	Declined string
	// NamedPrefiller is true when the request carried
	// x-prefiller-host-port, whatever its value (one that names no usable
	// prefiller included).
	NamedPrefiller bool
	// Status is the HTTP status answered (499: the client left first).
	Status int
	// Start is when the request arrived; Duration how long it lived.
	Start    time.Time
	Duration time.Duration
	// PrefillDuration is the whole prefill phase (0: no prefill ran).
	PrefillDuration time.Duration
	// KVHandoffDuration is the decode leg's send to first output when it
	// carried remote KV (0: no handoff reached that point).
	KVHandoffDuration time.Duration
	// KVTransferred is true when the decode engine produced output from the
	// remote KV: KV really moved.
	KVTransferred bool
	// DecodeChunks is the number of chunk requests of a chunked decode (0:
	// the decode was not chunked).
	DecodeChunks int
	// Encoder is the encoder stage's outcome (metrics.StageEncoded, ...;
	// "" when the request went through no encoder stage).
	Encoder string
	// History is multi-turn KV reuse's part in the request's prefill:
	// "used", or why it carried no history (metrics.Multiturn*); "" when
	// the request named no session, or its prefill was not sent.
	History string
}

// Outcome classifies a report of a request that named a prefiller:
// metrics.OutcomeSplit, OutcomeNoHandoff, OutcomeFallback, OutcomeRefused
// or OutcomeFailed.
func (r RequestReport) Outcome() string {
	switch {
	case r.Status >= 500 || r.Status == 499:
		return metrics.OutcomeFailed
	case r.Status >= 400:
		return metrics.OutcomeRefused
	case r.Mode == metrics.ModeFallback:
		return metrics.OutcomeFallback
	case r.Mode == metrics.ModeDisaggregated && r.KVTransferred:
		return metrics.OutcomeSplit
	}
	return metrics.OutcomeNoHandoff
}

// Observer learns how every inference request ended. ObserveRequest is
// called exactly once per inference request, on the goroutine that ends it;
// it must be safe for concurrent use and must not block.
type Observer interface {
	ObserveRequest(RequestReport)
}

// failureReason is the fallback reason of err, which a failed prefill
// leg's span carries.
func failureReason(err error) string { return failure.Of(err).Reason }

// traceStart opens the request's trace, from the client's trace context,
// when a feature traces requests.
func (r *Request) traceStart(h feature.TraceHead) {
	if t := r.P.tracer; t != nil {
		r.trace = t.TraceRequest(h, r.Start, r.ID, r.API.String())
	}
}

// PrefillStarted opens the prefill span; the returned func records the
// prefill's duration and outcome.
func (r *Request) PrefillStarted(start time.Time) func(error) {
	var span trace.Span
	if r.trace != nil {
		span = r.trace.StartPrefill(r.Label)
	}
	return func(err error) {
		d := time.Since(start)
		r.P.M.PrefillDuration.WithLabelValues(r.Label).Observe(d.Seconds())
		if err == nil {
			r.P.hedge.Observe(r.Label, d) // the auto hedge point's sample
		}
		r.Obs.PrefillDur = d
		if span != nil {
			r.trace.EndPrefill(span, err)
		}
	}
}

// DecodeStarted opens the decode span (and, for a leg carrying remote KV,
// the kv_handoff span) before the leg to the local engine is sent.
func (r *Request) DecodeStarted(remote bool) {
	if r.trace != nil {
		r.trace.StartDecode(remote, r.Label)
	}
}

// KVHandoffDone records the end of the engine-pull handoff: the decode leg
// sent at sent produced its first output (ok) or a KV load failure.
func (r *Request) KVHandoffDone(sent time.Time, ok bool) {
	d := time.Since(sent)
	r.KVPending = nil // the engine read the KV, or tried (awaitKVRead)
	r.P.M.KVTransferDuration.WithLabelValues(r.Label).Observe(d.Seconds())
	r.Obs.KVDur, r.Obs.KVOK = d, ok
	if ok && r.OnOutput != nil {
		r.OnOutput()
	}
	if r.trace != nil {
		r.trace.EndKVHandoff(ok)
	}
}

// Report ends the request's spans and tells the Observer how it ended.
func (r *Request) Report() {
	mode := r.Mode
	if mode == metrics.ModeDisaggregated && r.Prefiller == "" {
		mode = metrics.ModeLocal
	}
	if r.trace != nil {
		r.trace.End(mode, r.Label, r.Obs.Reason, r.Obs.Status)
	}
	rep := RequestReport{
		ID: r.ID, Mode: mode, Reason: r.Obs.Reason, Declined: r.Obs.Declined, Prefiller: r.Label, NamedPrefiller: r.named,
		Status: r.Obs.Status, Start: r.Start, Duration: time.Since(r.Start),
		PrefillDuration: r.Obs.PrefillDur, KVHandoffDuration: r.Obs.KVDur,
		KVTransferred: r.Obs.KVOK && mode == metrics.ModeDisaggregated,
		DecodeChunks:  r.Obs.Chunks,
		Encoder:       r.Obs.Encoder,
		History:       r.uses.HistoryOutcome(),
	}
	if rep.Prefiller != "" && rep.Declined == "" {
		o := rep.Outcome()
		reason := ""
		if o == metrics.OutcomeFallback {
			reason = rep.Reason
		}
		r.P.M.PrefillerRequests.WithLabelValues(rep.Prefiller, o, reason).Inc()
	}
	if o := r.P.Observer; o != nil {
		o.ObserveRequest(rep)
	}
}
