package connectors

import (
	"encoding/binary"
	"fmt"
	"math/bits"
	"unicode/utf8"
)

// maxJSONDepth bounds the nesting of a body ValidObject accepts (Python's
// json module, which vLLM and SGLang parse with, stops near 1000 too).
const maxJSONDepth = 512

// ValidObject reports whether body is exactly one JSON object (RFC 8259:
// strict numbers and literals, string escapes, no raw control characters,
// UTF-8 text), blanks allowed around it; else an error wrapping
// ErrMalformedJSON that says what is wrong and at which byte offset,
// quoting nothing of the body. A well-formed object that decoders read
// differently — a member name given twice in one object (escapes
// decoded), a lone surrogate escape — is an error wrapping
// ErrAmbiguousJSON (oneparse.go). It allocates nothing but for an object
// of more than 16 members (a set of its names) and escaped names. Strings, which hold
// nearly all of a prompt's bytes, are scanned eight bytes at a time: only
// a quote, a backslash, a control character or a non-ASCII byte stops the
// word scan.
func ValidObject(body []byte) error {
	return validate(body, nil)
}

// validate is ValidObject, and tells top of each member of the top-level
// object (nil: nothing).
// A request body's (top non-nil) read objects are checked for case
// variants of the names the sidecar reads too.
func validate(body []byte, top *BodyTop) error {
	v := validator{b: body, i: skipBlank(body, 0), top: top, names: memberNames{body: body}}
	if v.i >= len(body) || body[v.i] != '{' {
		return v.fail("not a JSON object")
	}
	kind := anyObject
	if top != nil {
		kind = readObject
	}
	if err := v.value(0, kind); err != nil {
		return err
	}
	if skipBlank(body, v.i) != len(body) {
		return fmt.Errorf("%w: data after the object at byte %d", ErrMalformedJSON, skipBlank(body, v.i))
	}
	return nil
}

// validator walks one JSON text; i is the offset of the next byte to read.
type validator struct {
	b     []byte
	i     int
	top   *BodyTop // told the top-level members (nil: none)
	names memberNames
	// escaped is set by str when the string holds an escape (reset by
	// whoever reads it).
	escaped bool
}

func (v *validator) fail(what string) error {
	return fmt.Errorf("%w: %s at byte %d", ErrMalformedJSON, what, v.i)
}

// value reads the value at v.i (blanks already skipped); an object there,
// or each object in an array there, is of kind.
func (v *validator) value(depth int, kind objectKind) error {
	if v.i >= len(v.b) {
		return v.fail("value expected")
	}
	switch c := v.b[v.i]; {
	case c == '{':
		return v.object(depth+1, kind)
	case c == '[':
		return v.array(depth+1, kind)
	case c == '"':
		return v.str()
	case c == 't':
		return v.literal("true")
	case c == 'f':
		return v.literal("false")
	case c == 'n':
		return v.literal("null")
	case c == '-' || c >= '0' && c <= '9':
		return v.number()
	}
	return v.fail("value expected")
}

func (v *validator) object(depth int, kind objectKind) error {
	if depth > maxJSONDepth {
		return v.fail("nesting too deep")
	}
	v.i = skipBlank(v.b, v.i+1)
	if v.i < len(v.b) && v.b[v.i] == '}' {
		v.i++
		return nil
	}
	names := v.names.begin() // dropped on success; an error ends the walk
	for {
		if v.i >= len(v.b) || v.b[v.i] != '"' {
			return v.fail("member name expected")
		}
		ns := v.i
		v.escaped = false
		if err := v.str(); err != nil {
			return err
		}
		ne := v.i
		name, ok := v.names.add(&names, ns+1, ne-1, v.escaped)
		if !ok {
			v.i = ns
			return v.ambiguous("a member name given twice in one object", name)
		}
		inner := anyObject
		if kind == readObject {
			if caseVariant(name) {
				v.i = ns
				return v.ambiguous("a member name that differs only in case from one the sidecar reads", nil)
			}
			if readContainer(name) {
				inner = readObject
			}
		}
		v.i = skipBlank(v.b, v.i)
		if v.i >= len(v.b) || v.b[v.i] != ':' {
			return v.fail("':' expected")
		}
		v.i = skipBlank(v.b, v.i+1)
		vs := v.i
		if err := v.value(depth, inner); err != nil {
			return err
		}
		if depth == 1 && v.top != nil {
			if what := v.top.member(v.b[ns+1:ne-1], v.b[vs:v.i]); what != "" {
				v.i = vs
				return v.ambiguous(what, nil)
			}
		}
		v.i = skipBlank(v.b, v.i)
		switch {
		case v.i < len(v.b) && v.b[v.i] == ',':
			v.i = skipBlank(v.b, v.i+1)
		case v.i < len(v.b) && v.b[v.i] == '}':
			v.i++
			v.names.end(&names)
			return nil
		default:
			return v.fail("',' or '}' expected")
		}
	}
}

// array reads an array whose object elements are of kind (an array in
// it holds objects of no kind).
func (v *validator) array(depth int, kind objectKind) error {
	if depth > maxJSONDepth {
		return v.fail("nesting too deep")
	}
	v.i = skipBlank(v.b, v.i+1)
	if v.i < len(v.b) && v.b[v.i] == ']' {
		v.i++
		return nil
	}
	for {
		elem := kind
		if v.i < len(v.b) && v.b[v.i] == '[' {
			elem = anyObject
		}
		if err := v.value(depth, elem); err != nil {
			return err
		}
		v.i = skipBlank(v.b, v.i)
		switch {
		case v.i < len(v.b) && v.b[v.i] == ',':
			v.i = skipBlank(v.b, v.i+1)
		case v.i < len(v.b) && v.b[v.i] == ']':
			v.i++
			return nil
		default:
			return v.fail("',' or ']' expected")
		}
	}
}

func (v *validator) literal(word string) error {
	if len(v.b)-v.i < len(word) || string(v.b[v.i:v.i+len(word)]) != word {
		return v.fail("invalid literal")
	}
	v.i += len(word)
	return nil
}

// number reads -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?.
func (v *validator) number() error {
	b := v.b
	if b[v.i] == '-' {
		v.i++
	}
	switch {
	case v.i < len(b) && b[v.i] == '0':
		v.i++
	case v.i < len(b) && b[v.i] >= '1' && b[v.i] <= '9':
		v.digits()
	default:
		return v.fail("invalid number")
	}
	if v.i < len(b) && b[v.i] == '.' {
		v.i++
		if v.digits() == 0 {
			return v.fail("invalid number")
		}
	}
	if v.i < len(b) && (b[v.i] == 'e' || b[v.i] == 'E') {
		v.i++
		if v.i < len(b) && (b[v.i] == '+' || b[v.i] == '-') {
			v.i++
		}
		if v.digits() == 0 {
			return v.fail("invalid number")
		}
	}
	return nil
}

func (v *validator) digits() int {
	start := v.i
	for v.i < len(v.b) && v.b[v.i] >= '0' && v.b[v.i] <= '9' {
		v.i++
	}
	return v.i - start
}

// SWAR constants: one byte value repeated in each of a word's eight bytes.
const (
	ones  = 0x0101010101010101
	highs = 0x8080808080808080
)

// special flags (high bit of the byte) the bytes of w that stop a string
// scan: '"', '\\', a control character, a non-ASCII byte. The lowest
// flagged byte is exact (a borrow can only flag bytes above a real match).
func special(w uint64) uint64 {
	q := w ^ ('"' * ones)
	s := w ^ ('\\' * ones)
	return ((q-ones)&^q | (s-ones)&^s | (w-0x20*ones)&^w | w) & highs
}

// plainRun skips the 64-byte blocks of b from i that hold no special byte:
// a prompt's text is mostly such blocks, and testing eight words at a time
// takes one branch per block instead of one per word (1.6 times the speed
// of the word loop alone on a long prompt of words; BenchmarkValidObject).
// str turns to it after eight clean words in a row, so that text with an
// escape every few words does not pay for blocks that fail.
func plainRun(b []byte, i int) int {
	for i+64 <= len(b) {
		w := b[i : i+64 : i+64]
		m := special(binary.LittleEndian.Uint64(w)) | special(binary.LittleEndian.Uint64(w[8:])) |
			special(binary.LittleEndian.Uint64(w[16:])) | special(binary.LittleEndian.Uint64(w[24:])) |
			special(binary.LittleEndian.Uint64(w[32:])) | special(binary.LittleEndian.Uint64(w[40:])) |
			special(binary.LittleEndian.Uint64(w[48:])) | special(binary.LittleEndian.Uint64(w[56:]))
		if m != 0 {
			return i
		}
		i += 64
	}
	return i
}

// str reads the string whose opening quote is at v.i.
func (v *validator) str() error {
	b := v.b
	v.i++
	for {
		clean := 0 // words in a row with no special byte
		for v.i+8 <= len(b) {
			if m := special(binary.LittleEndian.Uint64(b[v.i:])); m != 0 {
				v.i += bits.TrailingZeros64(m) >> 3
				break
			}
			v.i += 8
			if clean++; clean == 8 { // plain text: by blocks until one holds a special byte
				v.i, clean = plainRun(b, v.i), 0
			}
		}
		if v.i >= len(b) {
			return v.fail("unterminated string")
		}
		switch c := b[v.i]; {
		case c == '"':
			v.i++
			return nil
		case c == '\\':
			v.escaped = true
			if err := v.escape(); err != nil {
				return err
			}
		case c < 0x20:
			return v.fail("control character in a string")
		case c >= utf8.RuneSelf:
			r, n := utf8.DecodeRune(b[v.i:])
			if r == utf8.RuneError && n <= 1 {
				return v.fail("invalid UTF-8 in a string")
			}
			v.i += n
		default:
			v.i++
		}
	}
}

// escape reads the escape sequence whose backslash is at v.i.
func (v *validator) escape() error {
	b := v.b
	if v.i+1 >= len(b) {
		return v.fail("unterminated string")
	}
	switch b[v.i+1] {
	case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
		v.i += 2
		return nil
	case 'u':
		r, ok := hex4(b[v.i+2:])
		if !ok {
			return v.fail("invalid \\u escape")
		}
		switch {
		case r >= 0xDC00 && r < 0xE000:
			return v.ambiguous("a lone surrogate escape", nil)
		case r >= 0xD800 && r < 0xDC00:
			lo, ok := rune(0), false
			if len(b)-v.i >= 12 && b[v.i+6] == '\\' && b[v.i+7] == 'u' {
				lo, ok = hex4(b[v.i+8:])
			}
			if !ok || lo < 0xDC00 || lo >= 0xE000 {
				return v.ambiguous("a lone surrogate escape", nil)
			}
			v.i += 12
			return nil
		}
		v.i += 6
		return nil
	}
	return v.fail("invalid escape")
}
