package connectors

import "fmt"

// maxNullDepth bounds the nesting NullMembers walks, as ValidObject's.
const maxNullDepth = 512

// NullMembers returns the JSON value v with the value of every member
// named name written as null: at any depth, every copy of a repeated name,
// names compared decoded as a JSON parser reads them (a name spelled with
// \u escapes is the name it spells). The copy is appended to dst[:0]; n is
// how many values were nulled, and when none was (each such member absent
// or already null) v itself is returned, with no copy. A v that is not one
// well-formed JSON value (its strings, nesting up to 512 deep but inside
// a nulled value, names, ':' and ','; scalars are skipped as spelled, as an
// engine's NaN may be) is ErrMalformedJSON. name must be at most 32 bytes.
func NullMembers(dst, v []byte, name string) (out []byte, n int, err error) {
	w := nuller{b: v, name: name}
	end, err := w.value(0, 0)
	if err != nil {
		return v, 0, err
	}
	if skipBlank(v, end) != len(v) {
		return v, 0, fmt.Errorf("%w: data after the value", ErrMalformedJSON)
	}
	if len(w.spans) == 0 {
		return v, 0, nil
	}
	out, last := dst[:0], 0
	for _, s := range w.spans {
		out = append(out, v[last:s[0]]...)
		out = append(out, "null"...)
		last = s[1]
	}
	return append(out, v[last:]...), len(w.spans), nil
}

// nuller finds the values NullMembers writes as null: spans, in order
// (a nulled value is not walked: none is inside another).
type nuller struct {
	b     []byte
	name  string
	spans [][2]int
}

// value walks the value at b[i] (after blanks) and returns the offset
// just past it.
func (w *nuller) value(i, depth int) (int, error) {
	i = skipBlank(w.b, i)
	if i >= len(w.b) {
		return 0, fmt.Errorf("%w: value expected", ErrMalformedJSON)
	}
	switch w.b[i] {
	case '{', '[':
		if depth >= maxNullDepth {
			return 0, fmt.Errorf("%w: nested deeper than %d", ErrMalformedJSON, maxNullDepth)
		}
		if w.b[i] == '[' {
			return w.array(i, depth+1)
		}
		return w.object(i, depth+1)
	}
	return skipValue(w.b, i)
}

// object walks the object whose '{' is at b[i].
func (w *nuller) object(i, depth int) (int, error) {
	return walkObject(w.b, i, func(name []byte, _, vs int) (int, error) {
		if !nameIs(name, w.name) {
			return w.value(vs, depth)
		}
		// Nulled whole: skipped (its brackets matched, at any depth), not
		// walked.
		ve, err := skipValue(w.b, vs)
		if err == nil && string(w.b[vs:ve]) != "null" {
			w.spans = append(w.spans, [2]int{vs, ve})
		}
		return ve, err
	})
}

// array walks the array whose '[' is at b[i].
func (w *nuller) array(i, depth int) (int, error) {
	b := w.b
	i = skipBlank(b, i+1)
	if i < len(b) && b[i] == ']' {
		return i + 1, nil
	}
	for {
		ve, err := w.value(i, depth)
		if err != nil {
			return 0, err
		}
		i = skipBlank(b, ve)
		switch {
		case i < len(b) && b[i] == ',':
			i = skipBlank(b, i+1)
		case i < len(b) && b[i] == ']':
			return i + 1, nil
		default:
			return 0, fmt.Errorf("%w: ',' or ']' expected at %d", ErrMalformedJSON, i)
		}
	}
}
