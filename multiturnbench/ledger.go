package multiturnbench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/pd-sidecar/pd-sidecar/e2e/enginesim"
)

// errNoLedger: an engine answered GET /sim/computed with 404 (a build
// from before the ledger).
var errNoLedger = errors.New("engine-sim exports no GET /sim/computed")

// readLedger reads an engine's ledger.
func readLedger(ctx context.Context, e endpoint) ([]enginesim.LedgerEntry, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, e.url()+"/sim/computed", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("ledger of %s: %w", e.hostPort(), err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound {
		return nil, errNoLedger
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("ledger of %s: status %d", e.hostPort(), resp.StatusCode)
	}
	var out []enginesim.LedgerEntry
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(&out); err != nil {
		return nil, fmt.Errorf("ledger of %s: %w", e.hostPort(), err)
	}
	return out, nil
}

// readLedgers fills the records of a turn from the engines' ledgers: a
// request's computed tokens are summed over every engine that served a leg
// of it (the prefiller's prefill, and the decode engine's own prefill when
// the sidecar fell back), its history is what a prefill pulled, its pin
// what the decode leg pinned.
func readLedgers(ctx context.Context, engines []endpoint, recs []*turnRec) error {
	byID := map[string]*turnRec{}
	for _, r := range recs {
		if r != nil {
			byID[r.id] = r
		}
	}
	for _, e := range engines {
		entries, err := readLedger(ctx, e)
		if err != nil {
			return err
		}
		applyLedger(entries, byID)
	}
	return nil
}

// applyLedger adds the entries of one engine to the records they name.
func applyLedger(entries []enginesim.LedgerEntry, byID map[string]*turnRec) {
	for _, le := range entries {
		r, ok := byID[le.RequestID]
		if !ok {
			continue
		}
		r.measured = true
		r.computed += le.ComputedTokens
		r.history += le.HistoryTokens
		if le.PinnedBlocks > 0 {
			r.pinnedBlocks, r.pinnedTokens = le.PinnedBlocks, le.PinnedTokens
		}
	}
}
