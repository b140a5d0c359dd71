package observe

import (
	"strings"

	"go.opentelemetry.io/otel/propagation"

	"github.com/pd-sidecar/pd-sidecar/proxy/feature"
)

// inlineFields is how many propagator fields a fieldCarrier holds
// without an allocation of their own (W3C trace context and baggage need
// three).
const inlineFields = 4

// fieldCarrier adapts a client's head to the propagator, to extract from:
// the propagator's fields (names, lower case) as the head has them, read
// in one pass over the head whatever their letter case (the lane parses
// heads without normalizing their keys), a field's first value, nil where
// the head has none. A propagator reads only the fields it declares. The
// values are the head's, valid while it is unchanged (an Extract).
type fieldCarrier struct {
	names  []string
	vals   [][]byte
	inline [inlineFields][]byte
}

// readFields reads the fields names (lower case) of h.
func readFields(h feature.TraceHead, names []string) *fieldCarrier {
	c := &fieldCarrier{names: names}
	if len(names) <= inlineFields {
		c.vals = c.inline[:len(names)]
	} else {
		c.vals = make([][]byte, len(names))
	}
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

// Keys are the fields the head has, by the propagator's names.
func (c *fieldCarrier) Keys() []string {
	var ks []string
	for i, n := range c.names {
		if c.vals[i] != nil {
			ks = append(ks, n)
		}
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
