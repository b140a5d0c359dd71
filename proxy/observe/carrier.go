package observe

import (
	"go.opentelemetry.io/otel/propagation"

	"github.com/pd-sidecar/pd-sidecar/proxy/feature"
)

// headCarrier adapts a client's head to the propagator, to extract from.
type headCarrier struct{ h feature.TraceHead }

// Get finds k in any letter case: the lane parses heads without
// normalizing their keys.
func (c headCarrier) Get(k string) string {
	if v := c.h.Peek(k); v != nil {
		return string(v)
	}
	for hk, hv := range c.h.All() {
		if equalFold(hk, k) {
			return string(hv)
		}
	}
	return ""
}
func (c headCarrier) Set(string, string) {}
func (c headCarrier) Keys() []string {
	var ks []string
	for k := range c.h.All() {
		ks = append(ks, string(k))
	}
	return ks
}

// setCarrier adapts a leg's head to the propagator, to inject into.
type setCarrier struct{ h feature.HeaderSetter }

func (c setCarrier) Get(string) string { return "" }
func (c setCarrier) Set(k, v string)   { c.h.Set(k, v) }
func (c setCarrier) Keys() []string    { return nil }

// lineCarrier writes what a propagator injects as header lines.
type lineCarrier struct{ dst []byte }

func (c *lineCarrier) Get(string) string { return "" }
func (c *lineCarrier) Set(k, v string)   { c.dst = appendHeaderLine(c.dst, k, v) }
func (c *lineCarrier) Keys() []string    { return nil }

// appendHeaderLine appends the header line "k: v".
func appendHeaderLine(dst []byte, k, v string) []byte {
	dst = append(dst, k...)
	dst = append(dst, ": "...)
	dst = append(dst, v...)
	return append(dst, "\r\n"...)
}

// equalFold reports whether b is s, ASCII case-insensitively; s is lower
// case.
func equalFold(b []byte, s string) bool {
	if len(b) != len(s) {
		return false
	}
	for i, c := range b {
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != s[i] {
			return false
		}
	}
	return true
}

var (
	_ propagation.TextMapCarrier = setCarrier{}
	_ propagation.TextMapCarrier = (*lineCarrier)(nil)
)
