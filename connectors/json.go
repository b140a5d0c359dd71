package connectors

import (
	"bytes"
	"errors"
	"slices"
	"unsafe"

	"github.com/tidwall/gjson"
)

// Edit is one change to a member of a JSON object, applied by EditObject.
type Edit struct {
	// Key is the member's name.
	Key string
	// Raw is the member's new raw JSON value; ignored when Delete is set.
	Raw []byte
	// Delete removes the member instead of setting it.
	Delete bool
	// Nested, when set, edits the member's own object value with these
	// edits instead of replacing it (the member is left as is when absent or
	// not an object).
	Nested []Edit
}

// Bytes views b as a string without copying; the string must not outlive b
// nor be used after b changes.
func Bytes(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

// IsObject reports whether body starts, after blanks, with '{'.
func IsObject(body []byte) bool {
	for _, c := range body {
		switch c {
		case ' ', '\t', '\r', '\n':
			continue
		case '{':
			return true
		default:
			return false
		}
	}
	return false
}

// EditObject appends to dst a copy of the JSON object obj with edits applied
// in one pass: members named by an edit are replaced, deleted or edited in
// place (Nested), every other member is copied byte for byte, and set edits
// whose member was absent are appended at the end. obj is never modified and
// is never unmarshalled.
func EditObject(dst, obj []byte, edits []Edit) ([]byte, error) {
	return editObject(dst, obj, edits, true)
}

// editObject is EditObject; scan false walks the members with gjson only
// (the reference the scanning walk is fuzzed against).
func editObject(dst, obj []byte, edits []Edit, scan bool) ([]byte, error) {
	if !IsObject(obj) {
		return dst, ErrBadBody
	}
	var seen uint64 // bit i: edits[i] met a member; at most 64 edits
	if len(edits) > 64 {
		edits = edits[:64]
	}
	// One allocation at most: room for the object and every edit's value.
	room := len(obj)
	for i := range edits {
		room += len(edits[i].Key) + len(edits[i].Raw) + 4
	}
	dst = slices.Grow(dst, room)
	base := len(dst)
	dst = append(dst, '{')
	n := 0
	var err error
	// take copies or edits one member: key its name (unescaped), [ks, ke)
	// its raw name, [vs, ve) its raw value.
	take := func(key string, ks, ke, vs, ve int) bool {
		i := find(edits, key)
		if i < 0 {
			dst = member(dst, n, obj[ks:ve])
			n++
			return true
		}
		seen |= 1 << i
		e := &edits[i]
		switch {
		case e.Delete:
		case e.Nested != nil:
			dst = member(dst, n, obj[ks:vs])
			n++
			if raw := obj[vs:ve]; isObjectAt(raw) {
				dst, err = editObject(dst, raw, e.Nested, scan)
			} else {
				dst = append(dst, raw...)
			}
		default:
			dst = member(dst, n, obj[ks:ke])
			n++
			dst = append(dst, ':')
			dst = append(dst, e.Raw...)
		}
		return err == nil
	}
	// The members are found by scanObject, which skips a string (a prompt)
	// with bytes.IndexByte; an object it cannot walk is walked by gjson,
	// as it always was, whose reading of a malformed one is kept.
	if !scan || !editScan(obj, take) {
		dst, n, seen, err = dst[:base+1], 0, 0, nil
		gjson.Parse(Bytes(obj)).ForEach(func(k, v gjson.Result) bool {
			return take(k.Str, k.Index, k.Index+len(k.Raw), v.Index, v.Index+len(v.Raw))
		})
	}
	if err != nil {
		return dst, err
	}
	for i := range edits {
		e := &edits[i]
		if seen&(1<<i) != 0 || e.Delete || e.Nested != nil {
			continue
		}
		if n > 0 {
			dst = append(dst, ',')
		}
		n++
		dst = append(dst, '"')
		dst = append(dst, e.Key...)
		dst = append(dst, '"', ':')
		dst = append(dst, e.Raw...)
	}
	return append(dst, '}'), nil
}

// editScan walks the members of obj with scanObject, telling take each
// one, in one pass; false when obj is not an object scanObject can walk
// whole, or a member's name has escapes decodeName cannot decode (take may
// have been told some members: the caller starts again).
func editScan(obj []byte, take func(key string, ks, ke, vs, ve int) bool) bool {
	escaped := false
	_, err := scanObject(obj, skipBlank(obj, 0), func(m jsonMember) error {
		key := m.name
		if bytes.IndexByte(key, '\\') >= 0 {
			var buf [64]byte
			k, ok := decodeName(buf[:0], key)
			if !ok {
				escaped = true
				return errStop
			}
			key = k
		}
		if !take(Bytes(key), m.start, m.start+len(m.name)+2, m.end-len(m.value), m.end) {
			return errStop // take's own error, which the caller returns
		}
		return nil
	})
	return !escaped && (err == nil || errors.Is(err, errStop))
}

// errStop ends a scanObject walk early.
var errStop = errors.New("stop")

func member(dst []byte, n int, raw []byte) []byte {
	if n > 0 {
		dst = append(dst, ',')
	}
	return append(dst, raw...)
}

func find(edits []Edit, key string) int {
	for i := range edits {
		if edits[i].Key == key {
			return i
		}
	}
	return -1
}
