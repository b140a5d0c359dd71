package connectors

import (
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/tidwall/gjson"
)

// Members an Open schema does not document. Engines add members to their
// params from one release to the next (vLLM's NixlConnector added dcp_size,
// pp_size, remote_num_tokens, remote_blocks_expiry_time and transfer_mode
// in 2026), and the decode engine of that release reads them: refusing
// every answer that carries one would turn an engine upgrade into a
// fallback of every split. So an Open schema lets such a member pass — its
// name a plain identifier, given once, and its value one that cannot name
// an address (Passable) — written anew after the documented members, and
// reports its name for the proxy to count (or to refuse, when the operator
// asks for strict params). A member whose value could name an address is
// refused as before: an address reaches an engine only through a member
// the schema documents, and so only after the allowlist checked it.

// Bounds of an undocumented member.
const (
	// MaxUnknownMembers bounds the undocumented members one object may
	// carry.
	MaxUnknownMembers = 16
	// maxUnknownNameLen bounds an undocumented member's name.
	maxUnknownNameLen = 64
	// maxOpaqueDepth bounds the nesting of an undocumented member's value.
	maxOpaqueDepth = 4
	// maxOpaqueEntries bounds the entries of each array or object in it.
	maxOpaqueEntries = 1024
	// maxOpaqueString bounds each string in it.
	maxOpaqueString = 4096
)

// unknownMember is an undocumented member let pass, its value as read.
type unknownMember struct {
	name string
	val  gjson.Result
}

// write appends the member's value written anew.
func (u unknownMember) write(dst []byte) []byte { return writeOpaque(dst, u.val) }

// addUnknown checks the undocumented member name: val and adds it to extra.
func (s *Schema) addUnknown(extra []unknownMember, name string, val gjson.Result) ([]unknownMember, error) {
	if !PlainName(name) {
		return extra, s.invalid("", "an undocumented member whose name is not a plain identifier")
	}
	for _, u := range extra {
		if u.name == name {
			return extra, s.invalid(name, "an undocumented member given twice")
		}
	}
	if len(extra) >= MaxUnknownMembers {
		return extra, s.invalid("", fmt.Sprintf("more than %d undocumented members", MaxUnknownMembers))
	}
	if why := Passable(val); why != "" {
		// The name is a plain identifier: safe to say.
		return extra, s.invalid(name, "an undocumented member that "+why)
	}
	return append(extra, unknownMember{name: name, val: val}), nil
}

// PlainName reports whether name is a plain identifier: 1..64 bytes of
// ASCII letters, digits and underscores, not starting with a digit. Only
// such names are counted as metric labels and named in logs.
func PlainName(name string) bool {
	if len(name) == 0 || len(name) > maxUnknownNameLen || name[0] >= '0' && name[0] <= '9' {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}

// Passable returns "" when v, the value of a member no schema documents,
// may reach an engine: null, a boolean, a number, a string that cannot
// name an address (AddressLike), or an array or object of such values
// (nested at most 4 deep, 1,024 entries each; an object's names plain
// identifiers, each once). Otherwise it says why not, quoting nothing of v.
func Passable(v gjson.Result) string { return passable(v, 0) }

func passable(v gjson.Result, depth int) string {
	switch v.Type {
	case gjson.Null, gjson.True, gjson.False, gjson.Number:
		return ""
	case gjson.String:
		switch {
		case len(v.Str) > maxOpaqueString:
			return fmt.Sprintf("holds a string longer than %d bytes", maxOpaqueString)
		case AddressLike(v.Str):
			return "holds a string that could name an address"
		}
		return ""
	}
	if depth >= maxOpaqueDepth {
		return fmt.Sprintf("is nested deeper than %d", maxOpaqueDepth)
	}
	why, n := "", 0
	var names []string
	obj := v.IsObject()
	v.ForEach(func(k, x gjson.Result) bool {
		if n++; n > maxOpaqueEntries {
			why = fmt.Sprintf("holds more than %d entries in one array or object", maxOpaqueEntries)
			return false
		}
		if obj {
			if strings.IndexByte(k.Raw, '\\') >= 0 || !PlainName(k.Str) {
				why = "holds a name that is not a plain identifier"
				return false
			}
			for _, seen := range names {
				if seen == k.Str {
					why = "holds a name given twice"
					return false
				}
			}
			names = append(names, k.Str)
		}
		why = passable(x, depth+1)
		return why == ""
	})
	return why
}

// AddressLike reports whether s could name a network address to a
// resolver or a URL parser: a host (an IP literal in any form a resolver
// takes, "10.1", "0x7f000001" and "2130706433" included, or a DNS name,
// one label included, as a search domain completes it), host:port, a URL,
// userinfo@host, a bracketed or zoned IPv6 address, or any of these with
// blanks or control characters around or in it.
func AddressLike(s string) bool {
	if strings.ContainsAny(s, ":/@\\[]%") {
		return true
	}
	for i := 0; i < len(s); i++ {
		if s[i] < ' ' || s[i] == 0x7f {
			return true
		}
	}
	t := strings.TrimSpace(s)
	return t != "" && ValidHost(t)
}

// writeOpaque appends v, which Passable took, written anew: literals and
// numbers as validated, strings quoted from their unescaped value.
func writeOpaque(dst []byte, v gjson.Result) []byte {
	switch v.Type {
	case gjson.Null:
		return append(dst, "null"...)
	case gjson.True:
		return append(dst, "true"...)
	case gjson.False:
		return append(dst, "false"...)
	case gjson.Number:
		return append(dst, v.Raw...) // validated JSON (ValidObject)
	case gjson.String:
		return AppendJSONString(dst, v.Str)
	}
	obj := v.IsObject()
	open, end := byte('['), byte(']')
	if obj {
		open, end = '{', '}'
	}
	dst = append(dst, open)
	n := 0
	v.ForEach(func(k, x gjson.Result) bool {
		if n > 0 {
			dst = append(dst, ',')
		}
		n++
		if obj {
			dst = append(dst, '"')
			dst = append(dst, k.Str...) // a plain identifier
			dst = append(dst, '"', ':')
		}
		dst = writeOpaque(dst, x)
		return true
	})
	return append(dst, end)
}

// AppendJSONString appends s as a JSON string: quotes, backslashes and
// control characters escaped, invalid UTF-8 replaced by U+FFFD, the rest
// as it is.
func AppendJSONString(dst []byte, s string) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c >= 0x80 {
			r, size := utf8.DecodeRuneInString(s[i:])
			if r == utf8.RuneError && size == 1 {
				dst = append(dst, "\ufffd"...)
			} else {
				dst = append(dst, s[i:i+size]...)
			}
			i += size
			continue
		}
		switch {
		case c == '"' || c == '\\':
			dst = append(dst, '\\', c)
		case c < ' ':
			dst = append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		default:
			dst = append(dst, c)
		}
		i++
	}
	return append(dst, '"')
}
