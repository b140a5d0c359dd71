package connectors

import (
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
	dst = append(dst, '{')
	n := 0
	var err error
	gjson.Parse(Bytes(obj)).ForEach(func(k, v gjson.Result) bool {
		i := find(edits, k.Str)
		if i < 0 {
			dst = member(dst, n, obj[k.Index:v.Index+len(v.Raw)])
			n++
			return true
		}
		seen |= 1 << i
		e := &edits[i]
		switch {
		case e.Delete:
		case e.Nested != nil:
			dst = member(dst, n, obj[k.Index:v.Index])
			n++
			raw := obj[v.Index : v.Index+len(v.Raw)]
			if v.IsObject() {
				dst, err = EditObject(dst, raw, e.Nested)
			} else {
				dst = append(dst, raw...)
			}
		default:
			dst = member(dst, n, obj[k.Index:k.Index+len(k.Raw)])
			n++
			dst = append(dst, ':')
			dst = append(dst, e.Raw...)
		}
		return err == nil
	})
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
