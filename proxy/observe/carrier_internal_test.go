package observe

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/valyala/fasthttp"
)

func TestHeadCarrier(t *testing.T) {
	tests := []struct {
		name      string
		normalize bool
		key       string // as the head is given it
		get       string // as the propagator asks
		want      string
		keys      []string // as the head spells it
	}{
		{"normalized head", true, "traceparent", "traceparent", "v", []string{"Traceparent"}},
		{"raw head, lower case", false, "traceparent", "traceparent", "v", []string{"traceparent"}},
		{"raw head, capitalized", false, "Traceparent", "traceparent", "v", []string{"Traceparent"}},
		{"raw head, capitals", false, "TRACEPARENT", "traceparent", "v", []string{"TRACEPARENT"}},
		{"absent", false, "tracestate", "traceparent", "", []string{"tracestate"}},
		{"a longer key is another", false, "traceparent-x", "traceparent", "", []string{"traceparent-x"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var h fasthttp.RequestHeader
			if !tc.normalize {
				h.DisableNormalizing()
			}
			h.Set(tc.key, "v")
			c := headCarrier{&h}
			assert.Equal(t, tc.want, c.Get(tc.get))
			assert.Equal(t, tc.keys, c.Keys())
		})
	}
	var h fasthttp.RequestHeader
	setCarrier{&h}.Set("traceparent", "a")
	setCarrier{&h}.Set("traceparent", "b")
	assert.Equal(t, "b", string(h.Peek("traceparent")), "Set replaces")
	assert.Empty(t, setCarrier{&h}.Get("traceparent"), "a leg's head is only written")
}

func TestLineCarrier(t *testing.T) {
	c := lineCarrier{dst: []byte("GET / HTTP/1.1\r\n")}
	c.Set("traceparent", "00-a-b-01")
	c.Set("tracestate", "k=v")
	assert.Equal(t, "GET / HTTP/1.1\r\ntraceparent: 00-a-b-01\r\ntracestate: k=v\r\n", string(c.dst))
	assert.Empty(t, c.Get("traceparent"), "it only writes")
	assert.Nil(t, c.Keys())
}

// TestFieldCarrier: the propagator's fields are read from the head in one
// pass, whatever their letter case: a field's first value, "" for one the
// head lacks.
func TestFieldCarrier(t *testing.T) {
	var h fasthttp.RequestHeader
	h.DisableNormalizing()
	h.Set("TraceParent", "p1")
	h.Add("traceparent", "p2")
	h.Set("X-Other", "o")
	h.Set("BAGGAGE", "k=v")
	c := readFields(&h, []string{"traceparent", "tracestate", "baggage"})
	for k, want := range map[string]string{"traceparent": "p1", "tracestate": "", "baggage": "k=v", "Baggage": "k=v", "x-other": ""} {
		assert.Equal(t, want, c.Get(k), k)
	}
	assert.Equal(t, []string{"traceparent", "baggage"}, c.Keys())
}
