package status

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// Path is where the sidecar serves its Snapshot.
const Path = "/debug/pd"

// Fetch reads the Snapshot of the sidecar at base (http://host:port; a
// trailing /debug/pd is accepted) with client (nil: http.DefaultClient).
func Fetch(ctx context.Context, client *http.Client, base string) (Snapshot, error) {
	if client == nil {
		client = http.DefaultClient
	}
	url := strings.TrimSuffix(strings.TrimSuffix(base, "/"), Path) + Path
	var s Snapshot
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return s, fmt.Errorf("status: %w", err)
	}
	resp, err := client.Do(req)
	if err != nil {
		return s, fmt.Errorf("status: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return s, fmt.Errorf("status: GET %s answered %s (is it a pd-sidecar with /debug/pd?)", url, resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(&s); err != nil {
		return s, fmt.Errorf("status: decode %s: %w", url, err)
	}
	return s, nil
}

// WriteText writes the Snapshot for a person: the verdict first, then the
// window's counts, the last split and KV transfer, and a prefiller table.
func (s Snapshot) WriteText(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	p := func(format string, a ...any) { fmt.Fprintf(tw, format, a...) }
	p("%s: %s\n\n", strings.ToUpper(s.Verdict), s.Summary)
	p("connector:\t%s\n", s.Connector)
	p("kv transport:\t%s\n", s.Transport)
	if s.Engine != "" {
		p("local engine:\t%s %s\n", s.Engine, s.EngineVersion)
	}
	if len(s.UnknownKVMembers) > 0 {
		p("kv params members not documented:\t%s (a newer engine? see docs/connectors.md#compatibility)\n", strings.Join(s.UnknownKVMembers, ", "))
	}
	p("uptime:\t%s\n", (time.Duration(s.UptimeSeconds) * time.Second).String())
	p("window:\tlast %s\n", time.Duration(s.WindowSeconds)*time.Second)
	c := s.Window
	p("  disaggregated:\t%d\n", c.Disaggregated)
	p("  local:\t%d\n", c.Local)
	p("  fallback:\t%d\n", c.Fallback)
	p("  named a prefiller:\t%d\n", c.NamedPrefiller)
	p("    split (KV moved):\t%d\n", c.Split)
	p("    fell back:\t%d\n", c.FellBack)
	p("    answered 4xx:\t%d\n", c.Refused)
	p("    failed:\t%d\n", c.NamedFailed)
	p("    no KV handoff:\t%d\n", c.NoHandoff)
	for _, reason := range slices.Sorted(maps.Keys(c.DeclinedByReason)) {
		p("  declined (%s):\t%d\n", strings.ReplaceAll(reason, "_", " "), c.DeclinedByReason[reason])
	}
	p("  kv transferred:\t%d\n", c.KVTransferred)
	p("  failed (any request):\t%d\n", c.Failed)
	if c.ChunkedDecodes > 0 {
		p("  chunked decodes:\t%d (%d chunks)\n", c.ChunkedDecodes, c.DecodeChunks)
	}
	if len(c.FallbacksByReason) > 0 {
		p("  fallbacks by reason:\t%s\n", reasonsText(c.FallbacksByReason))
	}
	if len(c.Histories) > 0 {
		p("  multi-turn histories:\t%s\n", reasonsText(c.Histories))
	}
	if len(c.EncoderStages) > 0 {
		p("  encoder stages:\t%s\n", reasonsText(c.EncoderStages))
	}
	p("last split:\t%s\n", ago(s.Now, s.LastSplit))
	p("last kv transfer:\t%s\n", ago(s.Now, s.LastKVTransfer))
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("status: write: %w", err)
	}
	if len(s.Prefillers) == 0 {
		_, err := fmt.Fprintln(w, "\nprefillers: none seen")
		return err
	}
	fmt.Fprintln(tw, "\nPREFILLER\tCIRCUIT\tSPLITS\tFALLBACKS\tLAST REASON\tPREFILL P50\tPREFILL MAX\tKV P50\tLAST SUCCESS")
	for _, pf := range s.Prefillers {
		reason := pf.LastReason
		if reason == "" {
			reason = "-"
		}
		p("%s\t%s\t%d\t%d\t%s\t%.1fms\t%.1fms\t%.1fms\t%s\n", pf.Prefiller, circuitText(s.Now, pf), pf.Splits, pf.Fallbacks,
			reason, pf.PrefillP50Ms, pf.PrefillMaxMs, pf.KVHandoffP50Ms, ago(s.Now, pf.LastSuccess))
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("status: write: %w", err)
	}
	return nil
}

// circuitText is the CIRCUIT column: the state, and when an open circuit
// was last probed ("open (probing), probed 120ms ago").
func circuitText(now time.Time, pf Prefiller) string {
	if pf.CircuitLastProbe == nil {
		return pf.Circuit
	}
	return fmt.Sprintf("%s, probed %s ago", pf.Circuit, now.Sub(*pf.CircuitLastProbe).Round(10*time.Millisecond))
}

func ago(now time.Time, t *time.Time) string {
	if t == nil {
		return "never"
	}
	return now.Sub(*t).Round(time.Second).String() + " ago"
}
