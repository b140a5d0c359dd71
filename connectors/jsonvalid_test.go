package connectors_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"

	"github.com/pd-sidecar/pd-sidecar/connectors"
)

func TestValidObject(t *testing.T) {
	long := strings.Repeat("a quick brown fox \\n \\u00e9 é 😀 ", 100)
	for _, tc := range []struct {
		in string
		ok bool
	}{
		{`{}`, true},
		{" \n{\"a\":1} \t", true},
		{`{"prompt":"` + long + `","max_tokens":16,"stream":true,"x":null,"y":false}`, true},
		{`{"a":[1,-2,3.5,4e10,-0.5E-3,0],"b":{"c":[[],{}]}}`, true},
		{`{"a":"\"\\\/\b\f\n\r\t\uD83D\uDE00"}`, true},
		{`{"prompt":"x",}`, false},
		{`{"stream":tru}`, false},
		{`{"stream":truex}`, false},
		{`{"a":nul}`, false},
		{`{"a":01}`, false},
		{`{"a":1.}`, false},
		{`{"a":.5}`, false},
		{`{"a":1e}`, false},
		{`{"a":-}`, false},
		{`{"a":+1}`, false},
		{`{"a":"\q"}`, false},
		{`{"a":"\u12G4"}`, false},
		{`{"a":"\u12"}`, false},
		{"{\"a\":\"tab\there\"}", false},
		{"{\"a\":\"\xff\xfe\"}", false},
		{"{\"a\":\"\xe2\x82\"}", false},
		{`{"a" 1}`, false},
		{`{"a":1 "b":2}`, false},
		{`{"a":[1,,2]}`, false},
		{`{"a":[1 2]}`, false},
		{`{"a":{"b" 1}}`, false},
		{`{"a":[1}`, false},
		{`{"a":"x`, false},
		{`{"a":1} {}`, false},
		{`[{"a":1}]`, false},
		{`"x"`, false},
		{``, false},
		{`{1:2}`, false},
		{strings.Repeat("[", 600) + strings.Repeat("]", 600), false},
		{`{"a":` + strings.Repeat("[", 600) + strings.Repeat("]", 600) + `}`, false},
		{`{"a":` + strings.Repeat("[", 400) + strings.Repeat("]", 400) + `}`, true},
	} {
		err := connectors.ValidObject([]byte(tc.in))
		if tc.ok {
			assert.NoError(t, err, "%.80q", tc.in)
			continue
		}
		assert.True(t, errors.Is(err, connectors.ErrMalformedJSON), "%.80q: %v", tc.in, err)
	}
}

// FuzzValidObject: on UTF-8 input, ValidObject agrees with encoding/json
// (plus: the value is an object, nested at most 512 deep), but refuses
// what encoding/json accepts and other decoders read differently: a name
// twice in one object, a lone surrogate escape (refNames, refSurrogates).
func FuzzValidObject(f *testing.F) {
	for _, s := range []string{`{}`, `{"a":[1,2.5e3,"x\n"],"b":{"c":null}}`, `{"a":tru}`, `{"a":"\u00e9"}`, `{"a":1,}`, `[1]`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if !utf8.Valid(b) || bytes.Count(b, []byte{'['})+bytes.Count(b, []byte{'{'}) > 500 {
			return
		}
		want := json.Valid(b) && len(bytes.TrimLeft(b, " \t\r\n")) > 0 && bytes.TrimLeft(b, " \t\r\n")[0] == '{'
		err := connectors.ValidObject(b)
		if want && (refSurrogates(b) || refNames(b)) {
			if !errors.Is(err, connectors.ErrAmbiguousJSON) {
				t.Fatalf("ValidObject(%q) = %v, want ErrAmbiguousJSON", b, err)
			}
			return
		}
		if want != (err == nil) {
			t.Fatalf("ValidObject(%q) = %v, encoding/json says valid object: %v", b, err, want)
		}
	})
}

// BenchmarkValidObject: a ~128 KiB chat body whose prompt has an escape
// every 48 bytes, and one of plain words (pd-bench's long prompts).
func BenchmarkValidObject(b *testing.B) {
	var words strings.Builder
	for i := range 18000 {
		fmt.Fprintf(&words, "w%d ", i%997)
	}
	for _, bc := range []struct{ name, prompt string }{
		{"escapes", strings.Repeat("The quick brown fox jumps over the lazy dog. \\n ", 2800)},
		{"words", words.String()},
	} {
		b.Run(bc.name, func(b *testing.B) {
			body := []byte(`{"model":"m","messages":[{"role":"user","content":"` + bc.prompt + `"}],"max_tokens":16,"stream":true}`)
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				if err := connectors.ValidObject(body); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// refNames reports whether a valid JSON text names a member twice in one
// object, names decoded by encoding/json.
func refNames(b []byte) bool {
	d := json.NewDecoder(bytes.NewReader(b))
	type frame struct {
		names map[string]bool
		key   bool // the next token of an object is a name
	}
	var stack []*frame
	for {
		tok, err := d.Token()
		if err != nil {
			return false
		}
		var top *frame
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		if top != nil && top.names != nil && top.key {
			if d, ok := tok.(json.Delim); ok && d == '}' {
				stack = stack[:len(stack)-1]
				if len(stack) > 0 && stack[len(stack)-1].names != nil {
					stack[len(stack)-1].key = true
				}
				continue
			}
			name := tok.(string)
			if top.names[name] {
				return true
			}
			top.names[name] = true
			top.key = false
			continue
		}
		switch tok {
		case json.Delim('{'):
			stack = append(stack, &frame{names: map[string]bool{}, key: true})
			continue
		case json.Delim('['):
			stack = append(stack, &frame{})
			continue
		case json.Delim(']'):
			stack = stack[:len(stack)-1]
		}
		if len(stack) > 0 && stack[len(stack)-1].names != nil {
			stack[len(stack)-1].key = true
		}
	}
}

// refSurrogates reports whether a valid JSON text has a \u escape of a
// surrogate that is not the first half of a pair followed by its second.
func refSurrogates(b []byte) bool {
	in := false
	for i := 0; i < len(b); i++ {
		switch {
		case b[i] == '"':
			in = !in
		case in && b[i] == '\\' && b[i+1] == 'u':
			r, _ := strconv.ParseUint(string(b[i+2:i+6]), 16, 32)
			switch {
			case r >= 0xDC00 && r <= 0xDFFF:
				return true
			case r >= 0xD800 && r <= 0xDBFF:
				if i+12 > len(b) || b[i+6] != '\\' || b[i+7] != 'u' {
					return true
				}
				lo, _ := strconv.ParseUint(string(b[i+8:i+12]), 16, 32)
				if lo < 0xDC00 || lo > 0xDFFF {
					return true
				}
				i += 6
			}
			i += 5
		case in && b[i] == '\\':
			i++
		}
	}
	return false
}

// BenchmarkScanBodyTurns: a chat of 200 short turns, many small objects
// whose member names the one-parse check compares (about 14 ns a name on
// top of the scan).
func BenchmarkScanBodyTurns(b *testing.B) {
	var msgs []string
	for i := range 200 {
		msgs = append(msgs, fmt.Sprintf(`{"role":"%s","content":"turn %d says a few words here"}`, []string{"user", "assistant"}[i%2], i))
	}
	body := []byte(`{"model":"m","messages":[` + strings.Join(msgs, ",") + `],"max_tokens":16,"stream":true,"stream_options":{"include_usage":true}}`)
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if _, err := connectors.ScanBody(connectors.APIChat, body); err != nil {
			b.Fatal(err)
		}
	}
}
