package split

// Outcomes of a decode-first attempt (pd_sidecar_decode_first_total's
// outcome label, DecodeFirstCounted's Action.Reason).
const (
	// DecodeFirstServed: the decode engine answered from its own cache; no
	// prefill ran.
	DecodeFirstServed = "served"
	// DecodeFirstDeclined: the decode engine declined (cache_threshold); the
	// sequential handoff ran.
	DecodeFirstDeclined = "declined"
)

// The stages of a decode-first attempt.
type firstStage uint8

const (
	firstIdle    firstStage = iota
	firstLeg                // the decode-first leg runs, or its answer is held
	firstDecline            // declined: the body after the decline is built
	firstSplit              // handed to the usual split
	firstDone               // answered, or failed
)

// DecodeFirst is one request's decode-first attempt (the shared-storage
// connector with cache_hit_threshold): the decode engine is asked first; an
// answer it serves is relayed, one it declines hands the request, its body
// rewritten, to the usual split, and a failure before any output is
// answered.
type DecodeFirst struct {
	st firstStage
}

// NewDecodeFirst returns an idle decode-first attempt.
func NewDecodeFirst() *DecodeFirst { return &DecodeFirst{} }

// Done reports whether the attempt has decided: the request is answered,
// failed, or handed to the usual split (RunSplit).
func (s *DecodeFirst) Done() bool { return s.st == firstDone || s.st == firstSplit }

// Start begins the attempt; try says whether the connector selects the
// request to be tried on the decode engine first.
func (s *DecodeFirst) Start(try bool) []Action {
	if s.st != firstIdle {
		return nil
	}
	if !try {
		s.st = firstSplit
		return []Action{{Op: RunSplit}}
	}
	s.st = firstLeg
	return []Action{{Op: SendDecodeFirst}}
}

// On takes one event and returns what to do about it.
func (s *DecodeFirst) On(ev Event) []Action {
	switch s.st {
	case firstLeg:
		switch ev.Kind {
		case FirstAnswerReady:
			s.st = firstDone
			return []Action{{Op: RelayDecodeFirst}, {Op: DecodeFirstCounted, Reason: DecodeFirstServed}}
		case FirstAnswerDeclined:
			s.st = firstDecline
			return []Action{{Op: DropDecodeFirst}, {Op: DecodeFirstCounted, Reason: DecodeFirstDeclined}, {Op: BuildAfterDecline}}
		case FirstLegFailed:
			s.st = firstDone
			return []Action{{Op: Fail, Err: ev.Err}}
		case ClientGone:
			s.st = firstDone
			return []Action{{Op: DropDecodeFirst}, {Op: Fail, Err: ev.Err}}
		}
	case firstDecline:
		// A client that leaves now is the usual split's to see.
		switch ev.Kind {
		case AfterDeclineBuilt:
			s.st = firstSplit
			return []Action{{Op: RunSplit, Reason: DecodeFirstDeclined}}
		case AfterDeclineFailed:
			s.st = firstDone
			return []Action{{Op: Fail, Err: ev.Err}}
		}
	}
	return nil
}
