package core

import (
	"github.com/pd-sidecar/pd-sidecar/proxy/dprank"
	"github.com/pd-sidecar/pd-sidecar/proxy/encoder"
	"github.com/pd-sidecar/pd-sidecar/proxy/feature"
	"github.com/pd-sidecar/pd-sidecar/proxy/kvsource"
)

// LegSpec is what the request's legs carry beyond the client's head, said
// once and rendered by each driver its own way: the lane appends it to a
// leg's raw head (AppendTo, after rawhttp.AppendLegStart left out the
// client's headers that are no leg's), fasthttp's path sets it on the
// leg's head (relay.Exchange).
type LegSpec struct {
	// ID is our X-Request-ID, the only one a leg carries.
	ID string
	// Rank is the x-data-parallel-rank every leg carries (MoRI-IO's; "":
	// none), and DropRank whether the client's own is left out of every
	// leg (MoRI-IO pins a split's legs to its rank: Sidecar.SplitStrip on
	// the lane).
	Rank     string
	DropRank bool
	// PrefillRank is the rank the legs were paired on, which a prefill
	// leg carries ("": none), and RankPrefill whether a prefill leg carries
	// that rank alone, the client's own left out (Sidecar.PrefillStrip).
	PrefillRank string
	RankPrefill bool
	// Session is the session header, the sidecar's own: never forwarded
	// (every copy).
	Session string
	// Trace is the request's trace, whose context each leg carries (nil:
	// the request is not traced).
	Trace feature.Trace
}

// SidecarHeaders are the client's headers no leg carries besides the
// hop-by-hop ones (HopHeaders): those the sidecar reads, and those a leg
// the sidecar reads the answer of must not carry.
var SidecarHeaders = []string{HeaderPrefiller, dprank.Header, kvsource.Header, encoder.Header, "Accept-Encoding", "Expect"}

// Legs is what the request's legs carry beyond the client's head.
func (r *Request) Legs() LegSpec {
	s := LegSpec{ID: r.ID, Rank: r.uses.LegRank(), PrefillRank: r.prefillRank, Trace: r.trace}
	if r.P != nil {
		s.Session = r.P.sessionHeader
		s.DropRank = r.named && r.P.pinsSplitRank()
		s.RankPrefill = r.P.ranksPrefill()
	}
	return s
}

// AppendTo appends to a leg's raw head (prefill: a prefill leg's) the
// header lines the spec adds: the rank, a prefill leg's rank, the trace
// context.
func (s LegSpec) AppendTo(dst []byte, prefill bool) []byte {
	if s.Rank != "" {
		dst = appendRank(dst, s.Rank)
	}
	if s.Trace != nil {
		dst = s.Trace.AppendTrace(dst)
	}
	if prefill && s.PrefillRank != "" {
		dst = appendRank(dst, s.PrefillRank)
	}
	return dst
}

func appendRank(dst []byte, rank string) []byte {
	dst = append(dst, "X-Data-Parallel-Rank: "...)
	dst = append(dst, rank...)
	return append(dst, "\r\n"...)
}
