package observe

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/valyala/fasthttp"
)

// TestFieldCarrierLetterCase: a field is found whatever the letter case
// the head spells it in, normalized or raw; a longer key is another field.
func TestFieldCarrierLetterCase(t *testing.T) {
	tests := []struct {
		name      string
		normalize bool
		key       string // as the head is given it
		get       string // as the propagator asks
		want      string
		keys      []string // the fields the head has, by the propagator's names
	}{
		{"normalized head", true, "traceparent", "traceparent", "v", []string{"traceparent"}},
		{"raw head, lower case", false, "traceparent", "traceparent", "v", []string{"traceparent"}},
		{"raw head, capitalized", false, "Traceparent", "traceparent", "v", []string{"traceparent"}},
		{"raw head, capitals", false, "TRACEPARENT", "traceparent", "v", []string{"traceparent"}},
		{"absent", false, "tracestate", "traceparent", "", nil},
		{"a longer key is another", false, "traceparent-x", "traceparent", "", nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var h fasthttp.RequestHeader
			if !tc.normalize {
				h.DisableNormalizing()
			}
			h.Set(tc.key, "v")
			c := readFields(&h, []string{"traceparent"})
			assert.Equal(t, tc.want, c.Get(tc.get))
			assert.Equal(t, tc.keys, c.Keys())
		})
	}
	many := []string{"a", "b", "c", "d", "e", "traceparent"} // more than inlineFields
	var h fasthttp.RequestHeader
	h.Set("Traceparent", "v")
	assert.Equal(t, "v", readFields(&h, many).Get("traceparent"))
}

// TestSetCarrier: a leg's head is only written; Set replaces.
func TestSetCarrier(t *testing.T) {
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
