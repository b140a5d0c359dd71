package sse

import "bytes"

// IsBlank reports whether line, a line up to and including its '\n', is
// a blank line ("\n" or "\r\n"): the end of an event.
func IsBlank(line []byte) bool {
	return len(line) == 1 || (len(line) == 2 && line[0] == '\r')
}

var dataPrefix = []byte("data:")

// FirstData returns the payload of the event's first data line (nil when
// it has none, e.g. a comment).
func FirstData(ev []byte) []byte {
	for len(ev) > 0 {
		line := ev
		if i := bytes.IndexByte(ev, '\n'); i >= 0 {
			line, ev = ev[:i], ev[i+1:]
		} else {
			ev = nil
		}
		if bytes.HasPrefix(line, dataPrefix) {
			return bytes.TrimSpace(line[len(dataPrefix):])
		}
	}
	return nil
}

// Rewrite appends ev to dst with fn applied to each data payload (fn nil:
// ev as it is).
func Rewrite(dst, ev []byte, fn func([]byte) []byte) []byte {
	if fn == nil {
		return append(dst, ev...)
	}
	for len(ev) > 0 {
		line := ev
		if i := bytes.IndexByte(ev, '\n'); i >= 0 {
			line, ev = ev[:i+1], ev[i+1:]
		} else {
			ev = nil
		}
		if !bytes.HasPrefix(line, dataPrefix) {
			dst = append(dst, line...)
			continue
		}
		payload := bytes.TrimSpace(line[len(dataPrefix):])
		dst = append(dst, "data: "...)
		dst = append(dst, fn(payload)...)
		dst = append(dst, '\n')
	}
	return dst
}

// ErrorEvent is the event that ends a stream the upstream broke off: body
// (a JSON error body) as a data event, then [DONE].
func ErrorEvent(body []byte) []byte {
	b := append([]byte("data: "), body...)
	return append(b, "\n\ndata: [DONE]\n\n"...)
}
