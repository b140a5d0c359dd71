package main

import (
	"fmt"
	"time"

	"github.com/spf13/pflag"

	"github.com/pd-sidecar/pd-sidecar/proxy/hedge"
)

// hedgeAfter is --prefill-hedge-after's value: a duration (0: off) or
// "auto" (the hedge point of each prefiller from its recent prefill times).
type hedgeAfter struct{ c *hedge.Config }

func (h hedgeAfter) String() string {
	switch {
	case h.c == nil || !h.c.On():
		return "0s"
	case h.c.Auto:
		return "auto"
	}
	return h.c.After.String()
}

func (h hedgeAfter) Set(v string) error {
	if v == "auto" {
		h.c.Auto, h.c.After = true, 0
		return nil
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		return fmt.Errorf("a duration (e.g. 200ms; 0: off) or auto, not %q", v)
	}
	h.c.Auto, h.c.After = false, d
	return nil
}

func (h hedgeAfter) Type() string { return "duration" } // or "auto"; a string in a configuration file

// addHedgeFlags adds the flags of hedged prefill.
func addHedgeFlags(fs *pflag.FlagSet, c *hedge.Config) {
	fs.Var(hedgeAfter{c}, "prefill-hedge-after", "hedge point of a prefill: when it has not answered this long after it was sent, the local engine prefills the request too and the first ready wins, the other cancelled (a duration; auto: the 95th percentile of the prefiller's recent prefill times, at least "+hedge.AutoFloor.String()+"; 0: off)")
	fs.Float64Var(&c.Budget, "prefill-hedge-budget", c.Budget, "share of split requests that may be hedged (0..1; a token bucket refilled by each split request, bursts of 10)")
}
