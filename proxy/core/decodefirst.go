package core

import (
	"net/http"
	"time"

	"github.com/rs/zerolog"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/proxy/split"
)

// DecodeFirst is a request's side of its decode-first attempt
// (split.DecodeFirst: the shared-storage connector's cache_hit_threshold),
// which both drivers keep as a value: whether the decode engine is tried
// first, what its answer says, the body of the usual split after it
// declined, and the attempt's counting.
type DecodeFirst struct {
	r  *Request
	df connectors.DecodeFirst
}

// BeginDecodeFirst is request r's side of its decode-first attempt; its
// connector is a decode-first one (connectors.ChoreographyDecodeFirst).
func BeginDecodeFirst(r *Request) DecodeFirst {
	df, _ := r.P.Conn.(connectors.DecodeFirst)
	return DecodeFirst{r: r, df: df}
}

// Try reports whether the request is tried on the decode engine first,
// as the connector reads its body.
func (d DecodeFirst) Try() bool { return d.df.TryDecodeFirst(d.r.API, d.r.Body) }

// AfterDecline makes the request's body the one the usual split starts
// from after the decode engine declined it (the connector's rewrite).
func (d DecodeFirst) AfterDecline() error {
	body, err := d.df.AfterDecline(nil, d.r.API, d.r.Body)
	if err != nil {
		return err
	}
	d.r.Body = body
	return nil
}

// AnswerDeclines reports whether the decode engine's answer to a
// decode-first leg, read whole, of status, declines the request (not
// enough of its KV cached): a 200 the connector reads so.
func (d DecodeFirst) AnswerDeclines(status int, answer []byte) bool {
	return status == http.StatusOK && d.EventDeclines(answer)
}

// EventDeclines reports whether data, an event's data of the
// decode-first leg's stream (or a 200's answer whole), declines the
// request, as the connector reads it.
func (d DecodeFirst) EventDeclines(data []byte) bool {
	return d.df.Declined(d.r.API, data)
}

// Answered counts and logs the decode engine's answer to a
// decode-first leg, relayed as the request's: a JSON answer whole (its
// first output is now), or a stream about to begin (its first output is
// recorded when written).
func (d DecodeFirst) Answered(st int, stream bool) {
	r := d.r
	if !stream {
		r.P.M.TTFT.WithLabelValues(r.Mode).Observe(time.Since(r.Start).Seconds())
	}
	r.P.M.Requests.WithLabelValues(r.Mode, StatusLabel(st)).Inc()
	r.Obs.Status = st
	if stream {
		r.LogAt(zerolog.InfoLevel).Str("mode", r.Mode).Msg("streaming the decode engine's first answer")
		return
	}
	r.LogAt(zerolog.InfoLevel).Str("mode", r.Mode).Int("status", st).Msg("answered by the decode engine first")
}

// Account does the counting and logging of a decode-first
// attempt's action a (split.DecodeFirst), which both drivers hand it
// before they do its I/O, if any.
func (d DecodeFirst) Account(a split.Action) {
	r := d.r
	switch {
	case a.Op == split.DecodeFirstCounted:
		r.P.M.DecodeFirst.WithLabelValues(a.Reason).Inc()
	case a.Op == split.RunSplit && a.Reason == split.DecodeFirstDeclined:
		r.LogAt(zerolog.InfoLevel).Msg("decode engine declined (cache_threshold): prefill on the prefiller, then decode")
	}
}
