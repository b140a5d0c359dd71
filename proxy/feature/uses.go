package feature

import (
	"iter"

	"github.com/pd-sidecar/pd-sidecar/connectors"
)

// Head is what a feature or an admitter may read of a request's head, by
// a header's name, case-insensitively: its first value (nil: absent), or
// every value it has, in order.
type Head interface {
	Peek(key string) []byte
	PeekAll(key string) [][]byte
}

// Uses are the parts the registered features take in one request, in the
// order they were registered, and what the request asks of them at each
// point both drivers pass through. The zero Uses takes part in nothing.
type Uses struct {
	list []Use
	// inline holds the parts of a request that takes part in few, without
	// an allocation (list is inline[:n] until it outgrows it).
	inline [4]Use
	// declined is why a feature declined the request's split ("": none
	// did).
	declined string
}

// Begin asks every feature of fs for its part in request r, whose head
// is h, and keeps the parts (u is not copied afterwards). It returns why the first feature that
// declines the split declined it ("": none did); the request counts and
// reports that once.
func (u *Uses) Begin(fs []Feature, r Request, h Head) (declined string) {
	if u.list == nil {
		u.list = u.inline[:0]
	}
	for _, f := range fs {
		use := f.Begin(r, h)
		if use == nil {
			continue
		}
		u.list = append(u.list, use)
		if d, ok := use.(SplitDecliner); ok && u.declined == "" && !r.Refused {
			u.declined = d.DeclinedSplit()
			declined = u.declined
		}
	}
	return declined
}

// Declined reports whether a feature serves the request locally instead
// of splitting it.
func (u *Uses) Declined() bool { return u.declined != "" }

// EditPrefill gives the prefill leg's body to every feature that edits
// it.
func (u *Uses) EditPrefill(body []byte) ([]byte, error) {
	for _, use := range u.list {
		if e, ok := use.(PrefillEditor); ok {
			var err error
			if body, err = e.EditPrefill(body); err != nil {
				return nil, err
			}
		}
	}
	return body, nil
}

// DropOptionalPrefill takes back an optional edit of the prefill leg
// (OptionalPrefill), reporting whether one was taken back.
func (u *Uses) DropOptionalPrefill() bool {
	dropped := false
	for _, use := range u.list {
		if o, ok := use.(OptionalPrefill); ok && o.DropPrefillEdit() {
			dropped = true
		}
	}
	return dropped
}

// PrepareStep is the first blocking step a part has the split wait on
// before its first leg (Preparer); nil: none.
func (u *Uses) PrepareStep() Step {
	for _, use := range u.list {
		if p, ok := use.(Preparer); ok {
			if s := p.PrepareStep(); s != nil {
				return s
			}
		}
	}
	return nil
}

// EditDecodeParams gives the sequential decode leg's kv_transfer_params
// to every part that edits them (DecodeParamsEditor).
func (u *Uses) EditDecodeParams(params []byte) ([]byte, error) {
	for _, use := range u.list {
		if e, ok := use.(DecodeParamsEditor); ok {
			var err error
			if params, err = e.EditDecodeParams(params); err != nil {
				return nil, err
			}
		}
	}
	return params, nil
}

// LegRank is the x-data-parallel-rank the request's legs carry, the first
// a part names (LegRanker; "": none).
func (u *Uses) LegRank() string {
	for _, use := range u.list {
		if r, ok := use.(LegRanker); ok {
			if rank := r.LegRank(); rank != "" {
				return rank
			}
		}
	}
	return ""
}

// PairedLegBuilder is the part that builds a paired split's legs itself
// (nil: none; the connector builds them).
func (u *Uses) PairedLegBuilder() PairedLegBuilder {
	for _, use := range u.list {
		if b, ok := use.(PairedLegBuilder); ok {
			return b
		}
	}
	return nil
}

// EditLocal gives the body of a request served locally to every feature
// that edits it.
func (u *Uses) EditLocal(body []byte) ([]byte, error) {
	for _, use := range u.list {
		if e, ok := use.(LocalEditor); ok {
			var err error
			if body, err = e.EditLocal(body); err != nil {
				return nil, err
			}
		}
	}
	return body, nil
}

// HistoryOutcome is what the request's prefill did with a conversation's
// history (HistoryReporter; "": nothing to say).
func (u *Uses) HistoryOutcome() string {
	for _, use := range u.list {
		if h, ok := use.(HistoryReporter); ok {
			if o := h.HistoryOutcome(); o != "" {
				return o
			}
		}
	}
	return ""
}

// KVSource is the request's KV cache source (nil: none), for a
// choreography whose legs name it themselves (KVSourceNamer).
func (u *Uses) KVSource() *connectors.P2PPeer {
	for _, use := range u.list {
		if s, ok := use.(KVSourceNamer); ok {
			if peer := s.KVSource(); peer != nil {
				return peer
			}
		}
	}
	return nil
}

// AnswerEdit returns the edit of each piece of a split's decode answer:
// every feature's (AnswerEditor), in registration order; nil when nothing
// edits it. One part's edit is returned as it is; only two or more
// compose into a new function.
func (u *Uses) AnswerEdit() func([]byte) []byte {
	return u.compose(func(use Use) func([]byte) []byte {
		if e, ok := use.(AnswerEditor); ok {
			return e.AnswerEdit()
		}
		return nil
	})
}

// LocalAnswerEdit returns the edit of each piece of the answer of a
// request the local engine served without a split's KV: every feature's
// (LocalAnswerEditor); nil when nothing edits it.
func (u *Uses) LocalAnswerEdit() func([]byte) []byte {
	return u.compose(func(use Use) func([]byte) []byte {
		if e, ok := use.(LocalAnswerEditor); ok {
			return e.LocalAnswerEdit()
		}
		return nil
	})
}

// compose chains the edits edit finds in the parts (nil: the part has
// none), in order: nil for none, the one itself for one.
func (u *Uses) compose(edit func(Use) func([]byte) []byte) func([]byte) []byte {
	var one func([]byte) []byte
	var all []func([]byte) []byte
	for _, use := range u.list {
		e := edit(use)
		switch {
		case e == nil:
		case one == nil:
			one = e
		default:
			if all == nil {
				all = append(all, one)
			}
			all = append(all, e)
		}
	}
	if all == nil {
		return one
	}
	return func(d []byte) []byte {
		for _, e := range all {
			d = e(d)
		}
		return d
	}
}

// HandoffStepper is the part that takes a split's handoff on its way to
// the decode leg (nil: none does; the decode leg carries it as it is).
func (u *Uses) HandoffStepper() HandoffStepper {
	for _, use := range u.list {
		if s, ok := use.(HandoffStepper); ok {
			return s
		}
	}
	return nil
}

// All are the parts, in registration order, for an ability declared by
// the package that asks it (chunked.Planner).
func (u *Uses) All() iter.Seq[Use] {
	return func(yield func(Use) bool) {
		for _, use := range u.list {
			if !yield(use) {
				return
			}
		}
	}
}
