package rawhttp

import (
	"bytes"
	"slices"
)

// The connection options of a message (RFC 9110 §7.6.1): a Connection
// field lists, besides close and keep-alive, the names of other fields
// that are meant for this hop alone (Connection: X-Hop-Secret), and a
// proxy removes them before it forwards the message. Both drivers do so,
// in both directions: from every leg the client's request makes, and from
// the client's answer an engine's makes. A message whose Connection fields
// name nothing else (all but a few) costs a look at each Connection value.
//
// The fields a message is read by are never removed, whatever it names:
// the sidecar writes Host, Content-Length and Transfer-Encoding itself, and
// Content-Type says how the body is read (without it fasthttp would write a
// default type of its own, and an engine refuses a JSON body).

// namesOptions reports whether a Connection field's value v names an option
// other than close and keep-alive.
func namesOptions(v []byte) bool {
	for len(v) > 0 {
		var tok []byte
		tok, v = nextOption(v)
		if len(tok) > 0 && !EqualFold(tok, "close") && !EqualFold(tok, "keep-alive") {
			return true
		}
	}
	return false
}

// nextOption returns the first comma-separated token of v, without the
// spaces and tabs around it, and what follows its comma.
func nextOption(v []byte) (tok, rest []byte) {
	tok = v
	if i := bytes.IndexByte(v, ','); i >= 0 {
		tok, rest = v[:i], v[i+1:]
	}
	return bytes.Trim(tok, " \t"), rest
}

// namedBy reports whether the field named k is a connection option of one
// of the Connection values conn, and not a field the message is read by.
func namedBy(k []byte, conn [][]byte) bool {
	if kept(k) {
		return false
	}
	for _, v := range conn {
		for len(v) > 0 {
			var tok []byte
			tok, v = nextOption(v)
			if len(tok) == len(k) && bytes.EqualFold(tok, k) {
				return true
			}
		}
	}
	return false
}

// kept reports whether k names a field the message is read by, never
// removed as a connection option.
func kept(k []byte) bool {
	switch len(k) {
	case 4:
		return EqualFold(k, "host")
	case 12:
		return EqualFold(k, "content-type")
	case 14:
		return EqualFold(k, "content-length")
	case 17:
		return EqualFold(k, "transfer-encoding")
	}
	return false
}

// isConnection reports whether k is Connection, in any letter case.
func isConnection(k []byte) bool { return len(k) == 10 && EqualFold(k, "connection") }

// connectionValues returns the values of the Connection fields fields
// yields (fields is h.All of a fasthttp header).
func connectionValues(fields func(yield func(k, v []byte) bool)) [][]byte {
	var conn [][]byte
	for k, v := range fields {
		if isConnection(k) {
			conn = append(conn, v)
		}
	}
	return conn
}

// Options removes connection options from a fasthttp header: the fasthttp
// path's legs and answers, whose field names fasthttp normalized.
type Options interface {
	PeekAll(key string) [][]byte
	DelBytes(key []byte)
}

// DelOptions removes from h every field its Connection fields name as a
// connection option, every copy, but for the fields a message is read by;
// h's Connection fields themselves are left for the caller, which removes
// every hop-by-hop field. A head whose Connection fields name nothing but
// close and keep-alive is not changed.
func DelOptions(h Options) {
	conn := h.PeekAll("Connection")
	if !slices.ContainsFunc(conn, namesOptions) {
		return
	}
	var names [][]byte
	for _, v := range conn {
		for v := bytes.Clone(v); len(v) > 0; {
			var tok []byte
			tok, v = nextOption(v)
			if len(tok) > 0 && !kept(tok) && !EqualFold(tok, "close") && !EqualFold(tok, "keep-alive") {
				names = append(names, tok)
			}
		}
	}
	for _, n := range names {
		h.DelBytes(n)
	}
}
