package loadgen

import (
	"slices"
	"time"
)

// TargetResults gathers every result of one target over all rounds.
type TargetResults struct {
	Target  Target
	Results []Result
	// Active is the total time the target was driven.
	Active time.Duration
	// Dropped counts open-loop arrivals refused for MaxOutstanding.
	Dropped int
}

func (t *TargetResults) add(rs []Result, active time.Duration, dropped int) {
	t.Results = append(t.Results, rs...)
	t.Active += active
	t.Dropped += dropped
}

// Percentiles of one latency measure, in milliseconds.
type Percentiles struct {
	P50 float64 `json:"p50_ms"`
	P90 float64 `json:"p90_ms"`
	P99 float64 `json:"p99_ms"`
	Max float64 `json:"max_ms"`
}

// Summary is the digest of one target's results.
type Summary struct {
	Name     string         `json:"name"`
	URL      string         `json:"url"`
	Requests int            `json:"requests"`
	OK       int            `json:"ok"`
	Errors   map[string]int `json:"errors"`
	CutShort int            `json:"cut_short"`
	Dropped  int            `json:"dropped"`
	// Left counts the requests whose client left on purpose
	// (Load.LeaveShare), neither ok nor errors; LeftAfterHead those of
	// them that had the answer's head before they left.
	Left          int `json:"left"`
	LeftAfterHead int `json:"left_after_head"`
	Tokens        int `json:"tokens"`
	// BodyBytes is the request body bytes sent, over every request.
	BodyBytes  int64       `json:"body_bytes"`
	ReqPerSec  float64     `json:"req_per_sec"`
	TokPerSec  float64     `json:"tok_per_sec"`
	TTFT       Percentiles `json:"ttft"`
	InterToken Percentiles `json:"inter_token"`
	E2E        Percentiles `json:"e2e"`
	ActiveSec  float64     `json:"active_sec"`
}

// Summarize digests t.
func Summarize(t *TargetResults) Summary {
	s := Summary{Name: t.Target.Name, URL: t.Target.URL, Requests: len(t.Results), Errors: map[string]int{},
		Dropped: t.Dropped, ActiveSec: t.Active.Seconds()}
	var ttft, gaps, e2e []time.Duration
	for _, r := range t.Results {
		s.BodyBytes += int64(r.BodyBytes)
		if r.Left {
			s.Left++
			if r.Status != 0 {
				s.LeftAfterHead++
			}
			continue
		}
		if r.Err != "" {
			s.Errors[r.Err]++
			if r.Err == ErrKindCut {
				s.CutShort++
			}
			continue
		}
		s.OK++
		s.Tokens += r.Tokens
		ttft = append(ttft, r.TTFT)
		e2e = append(e2e, r.Latency)
		gaps = append(gaps, r.Gaps...)
	}
	if t.Active > 0 {
		s.ReqPerSec = float64(s.OK) / t.Active.Seconds()
		s.TokPerSec = float64(s.Tokens) / t.Active.Seconds()
	}
	s.TTFT, s.InterToken, s.E2E = percentiles(ttft), percentiles(gaps), percentiles(e2e)
	return s
}

func percentiles(ds []time.Duration) Percentiles {
	if len(ds) == 0 {
		return Percentiles{}
	}
	slices.Sort(ds)
	at := func(p float64) float64 {
		i := int(p * float64(len(ds)-1))
		return float64(ds[i]) / float64(time.Millisecond)
	}
	return Percentiles{P50: at(0.50), P90: at(0.90), P99: at(0.99), Max: at(1)}
}

// Median of ds (0 for none); the mean of the two middle values for an even
// count.
func Median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
