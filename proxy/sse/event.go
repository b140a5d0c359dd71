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
// ev as it is). An event of several data lines is one payload to a
// client, their lines joined with '\n' (the SSE format): fn gets that
// whole (rewriteJoined).
func Rewrite(dst, ev []byte, fn func([]byte) []byte) []byte {
	if fn == nil {
		return append(dst, ev...)
	}
	if !bytes.Contains(ev, dataAfter) {
		return rewriteLines(dst, ev, fn)
	}
	// ev may be more than one event (a held preamble): each on its own.
	for len(ev) > 0 {
		end := eventEnd(ev)
		dst = rewriteJoined(dst, ev[:end], fn)
		ev = ev[end:]
	}
	return dst
}

// eventEnd returns the offset just past ev's first blank line (the end of
// its first event), or len(ev).
func eventEnd(ev []byte) int {
	for i := 0; i < len(ev); {
		j := bytes.IndexByte(ev[i:], '\n')
		if j < 0 {
			break
		}
		if IsBlank(ev[i : i+j+1]) {
			return i + j + 1
		}
		i += j + 1
	}
	return len(ev)
}

// dataAfter begins a data line that is not the event's first line.
var dataAfter = []byte("\ndata:")

// rewriteLines appends ev to dst with fn applied to each data line's
// payload.
func rewriteLines(dst, ev []byte, fn func([]byte) []byte) []byte {
	for line := range bytes.Lines(ev) {
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

// rewriteJoined rewrites one event; one of more than one data line: fn gets
// their payloads joined with '\n', as a client reads them, and what it
// returns is written as data lines again, one per line of it, where the
// event's first data line was; the event's other lines stay as they came.
// An engine that cuts a JSON answer across data lines (which none does)
// is thus rewritten as the client will read it.
func rewriteJoined(dst, ev []byte, fn func([]byte) []byte) []byte {
	var joined []byte
	n := 0
	for line := range bytes.Lines(ev) {
		if p, ok := bytes.CutPrefix(line, dataPrefix); ok { // its '\n' trimmed below
			if n > 0 {
				joined = append(joined, '\n')
			}
			joined = append(joined, bytes.TrimSpace(p)...)
			n++
		}
	}
	if n < 2 {
		return rewriteLines(dst, ev, fn) // one data line, after another line
	}
	out := fn(joined)
	written := false
	for line := range bytes.Lines(ev) {
		if !bytes.HasPrefix(line, dataPrefix) {
			dst = append(dst, line...)
			continue
		}
		if written {
			continue
		}
		written = true
		for part := range bytes.SplitSeq(out, []byte{'\n'}) {
			dst = append(dst, "data: "...)
			dst = append(dst, part...)
			dst = append(dst, '\n')
		}
	}
	return dst
}
