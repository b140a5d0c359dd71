package enginesim

import (
	"encoding/json"
	"net/http"
)

// ledger keeps, for the last requests the engine finished, what each cost
// its KV: the prompt tokens it computed, the history it pulled from a
// decode engine instead, and the blocks it pinned for the next turn
// (GET /sim/computed). sim_prefill_computed_tokens_total sums the same
// computed tokens over every request; the ledger tells them apart by
// request id, so that a bench can check each turn of each conversation
// rather than a mean.
type ledger = recent[LedgerEntry]

// LedgerEntry is one finished request in GET /sim/computed.
type LedgerEntry struct {
	// RequestID is the request's X-Request-Id (the engine's own id when
	// it came without one).
	RequestID string `json:"request_id"`
	// Leg is how the engine served it: prefill (a prefill leg for a
	// remote decoder), decode (on KV from a prefiller) or local.
	Leg string `json:"leg"`
	// PromptTokens is the prompt's length; ComputedTokens the part of it
	// this engine computed (what it added to
	// sim_prefill_computed_tokens_total): the prompt less prefix-cache
	// hits, blocks loaded from the shared storage, history pulled and KV
	// received from a prefiller.
	PromptTokens   int `json:"prompt_tokens"`
	ComputedTokens int `json:"computed_tokens"`
	// HistoryTokens is the prompt tokens whose KV a prefill leg pulled
	// from a decode engine's pinned sequence (bidirectional KV transfer).
	HistoryTokens int `json:"history_tokens"`
	// PinnedBlocks and PinnedTokens are the sequence a decode leg pinned
	// for the next turn (0: none pinned).
	PinnedBlocks int `json:"pinned_blocks"`
	PinnedTokens int `json:"pinned_tokens"`
}

// ledgerLimit is how many finished requests the ledger keeps.
const ledgerLimit = 4096

func newLedger(limit int) *ledger { return newRecent[LedgerEntry](limit) }

// record enters a finished request; pin is the sequence it pinned (nil:
// none).
func (s *Sim) record(g *genRequest, leg legKind, kv kvLoaded, rid string, pin *hold) {
	e := LedgerEntry{RequestID: rid, Leg: leg.label(), PromptTokens: len(g.prompt),
		ComputedTokens: len(g.prompt) - kv.cached, HistoryTokens: kv.history}
	if pin != nil {
		e.PinnedBlocks, e.PinnedTokens = len(pin.blocks), pin.tokens
	}
	s.ledger.add(e)
}

func (s *Sim) listComputed(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(s.ledger.list())
}
