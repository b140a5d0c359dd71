package observe

import (
	"strings"

	"go.opentelemetry.io/otel/propagation"

	"github.com/pd-sidecar/pd-sidecar/proxy/feature"
)

// carriedFields is how many propagator fields a fieldCarrier holds; a
// propagator with more is read through a headCarrier.
const carriedFields = 4

// fieldCarrier is the propagator's fields (names, lower case) as the
// client's head has them, read in one pass over the head whatever their
// letter case (the lane parses heads without normalizing their keys): a
// field's first value, nil where the head has none. The values are the
// head's, valid while it is unchanged (an Extract).
type fieldCarrier struct {
	names []string
	vals  [carriedFields][]byte
}

// readFields reads the fields names (at most carriedFields, lower case)
// of h.
func readFields(h feature.TraceHead, names []string) *fieldCarrier {
	c := &fieldCarrier{names: names}
	for k, v := range h.All() {
		for i, n := range names {
			if c.vals[i] == nil && equalFold(k, n) {
				c.vals[i] = v
				break
			}
		}
	}
	return c
}

func (c *fieldCarrier) Get(k string) string {
	for i, n := range c.names {
		if strings.EqualFold(n, k) {
			return string(c.vals[i])
		}
	}
	return ""
}
func (c *fieldCarrier) Set(string, string) {}
func (c *fieldCarrier) Keys() []string {
	var ks []string
	for i, n := range c.names {
		if c.vals[i] != nil {
			ks = append(ks, n)
		}
	}
	return ks
}

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
	_ propagation.TextMapCarrier = (*fieldCarrier)(nil)
	_ propagation.TextMapCarrier = (*lineCarrier)(nil)
)
