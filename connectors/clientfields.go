package connectors

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// The client's connector fields: request members that tell an engine where
// to fetch or send KV (or encoder-cache) data. An engine trusts them, so a
// client that sends its own would make the engine connect wherever it
// names, past the sidecar's SSRF protection; the sidecar removes them and
// sets its own where a choreography needs them.
//
// Where engines read them: vLLM's kv_transfer_params / ec_transfer_params
// at the top level of every inference API (remote_host, remote_port,
// remote_bootstrap_addr, transfer_id, the sidecar connector's kv_source and
// kv_preloaded live inside them), and, on /inference/v1/generate, also in
// sampling_params.extra_args (where vLLM itself moves them); SGLang's
// bootstrap_host / bootstrap_port / bootstrap_room / bootstrap_pair_key at
// the top level. The inner names are removed at the top level too, where
// no engine reads them today, so that no engine version that would can be
// reached.

// ClientFields is a set of client connector fields, one bit per name of
// ClientFieldNames.
type ClientFields uint16

// clientFieldNames index the bits of ClientFields.
var clientFieldNames = [...]string{
	"kv_transfer_params", "ec_transfer_params",
	"bootstrap_host", "bootstrap_port", "bootstrap_room", "bootstrap_pair_key",
	"remote_bootstrap_addr", "transfer_id", "kv_source", "kv_preloaded",
}

// ClientFieldNames returns the names of the client connector fields (the
// closed set of pd_sidecar_requests_sanitized_total's field label).
func ClientFieldNames() []string { return append([]string(nil), clientFieldNames[:]...) }

// Names returns the names of the fields in f.
func (f ClientFields) Names() []string {
	var out []string
	for i, n := range clientFieldNames {
		if f&(1<<i) != 0 {
			out = append(out, n)
		}
	}
	return out
}

// ErrMalformedJSON: the body is not a well-formed JSON object, so what an
// engine would read in it cannot be told (the caller refuses it rather
// than guess).
var ErrMalformedJSON = errors.New("connectors: request body is not a well-formed JSON object")

// FindClientFields reports which client connector fields the JSON object
// body names where an engine of api reads them (every copy of a repeated
// name counts); a body that is not a well-formed object is
// ErrMalformedJSON. It reads the body once, skipping strings with
// bytes.IndexByte, and compares member names decoded, as an engine decodes
// them (a name spelled with \u escapes is the name it spells); it
// allocates nothing.
func FindClientFields(api API, body []byte) (ClientFields, error) {
	var found ClientFields
	_, err := scanTop(body, func(obj []byte, m jsonMember, path int) error {
		if i := clientField(m.name); i >= 0 && path != pathDescend {
			found |= 1 << i
		}
		return nil
	}, api == APIGenerate)
	return found, err
}

// StripClientFields returns body without the client connector fields an
// engine of api reads, appended to dst[:0], and which were removed; when
// none was, body itself is returned (no copy). Every copy of a repeated
// name is removed; every other member is kept byte for byte.
func StripClientFields(dst []byte, api API, body []byte) ([]byte, ClientFields, error) {
	found, err := FindClientFields(api, body)
	if err != nil || found == 0 {
		return body, found, err
	}
	out, err := stripObject(dst[:0], body, 0, api == APIGenerate)
	if err != nil {
		return body, 0, err
	}
	return out, found, nil
}

// The member paths the scanner walks: the top-level object, and on
// /inference/v1/generate sampling_params.extra_args.
const (
	pathTop     = iota // a member of the top-level object
	pathDescend        // sampling_params, or its extra_args: walked into, kept
	pathInner          // a member of sampling_params.extra_args
)

// jsonMember is one member of an object: name is its raw (still escaped)
// name, [start, end) the member from its name's quote to its value's end,
// value its raw value.
type jsonMember struct {
	name       []byte
	start, end int
	value      []byte
}

// scanTop scans body, which must be one JSON object and nothing more, and
// calls fn for each member that matters: every top-level member and, with
// generate, the members of sampling_params.extra_args (sampling_params and
// extra_args themselves with path pathDescend).
func scanTop(body []byte, fn func(obj []byte, m jsonMember, path int) error, generate bool) (int, error) {
	end, err := scanObject(body, skipBlank(body, 0), func(m jsonMember) error {
		if generate && nameIs(m.name, "sampling_params") && isObjectAt(m.value) {
			if err := fn(body, m, pathDescend); err != nil {
				return err
			}
			_, err := scanObject(m.value, skipBlank(m.value, 0), func(e jsonMember) error {
				if !nameIs(e.name, "extra_args") || !isObjectAt(e.value) {
					return nil
				}
				if err := fn(m.value, e, pathDescend); err != nil {
					return err
				}
				_, err := scanObject(e.value, skipBlank(e.value, 0), func(x jsonMember) error {
					return fn(e.value, x, pathInner)
				})
				return err
			})
			return err
		}
		return fn(body, m, pathTop)
	})
	if err != nil {
		return 0, err
	}
	if skipBlank(body, end) != len(body) {
		return 0, fmt.Errorf("%w: data after the object", ErrMalformedJSON)
	}
	return end, nil
}

// stripObject appends obj (one object) without its client
// connector fields; depth 0 is the top level, 1 sampling_params, 2 its
// extra_args (generate only).
func stripObject(dst, obj []byte, depth int, generate bool) ([]byte, error) {
	dst = append(dst, '{')
	n := 0
	_, err := scanObject(obj, skipBlank(obj, 0), func(m jsonMember) error {
		descend := generate && isObjectAt(m.value) &&
			(depth == 0 && nameIs(m.name, "sampling_params") || depth == 1 && nameIs(m.name, "extra_args"))
		switch {
		case descend:
			if n > 0 {
				dst = append(dst, ',')
			}
			n++
			dst = append(dst, obj[m.start:m.end-len(m.value)]...) // the name and ':'
			var err error
			dst, err = stripObject(dst, m.value, depth+1, generate)
			return err
		case depth != 1 && clientField(m.name) >= 0:
			return nil // removed
		}
		if n > 0 {
			dst = append(dst, ',')
		}
		n++
		dst = append(dst, obj[m.start:m.end]...)
		return nil
	})
	return append(dst, '}'), err
}

// scanObject reads the object whose '{' is at b[i] and calls fn for each
// member in order; it returns the offset just past the object's '}'. It
// checks the structure (strings, nesting, names, ':' and ',') but not the
// spelling of scalars, which it skips whole.
func scanObject(b []byte, i int, fn func(jsonMember) error) (int, error) {
	if i >= len(b) || b[i] != '{' {
		return 0, fmt.Errorf("%w: no object", ErrMalformedJSON)
	}
	return walkObject(b, i, func(name []byte, start, vs int) (int, error) {
		ve, err := skipValue(b, vs)
		if err != nil {
			return 0, err
		}
		return ve, fn(jsonMember{name: name, start: start, end: ve, value: b[vs:ve]})
	})
}

// walkObject walks the object whose '{' is at b[i]: for each member in
// order, value reads the value at b[vs] (after blanks) and returns the
// offset just past it; start is where the member's name begins, name its
// bytes as spelled. It checks the names, ':', ',' and the closing '}', and
// returns the offset just past it.
func walkObject(b []byte, i int, value func(name []byte, start, vs int) (int, error)) (int, error) {
	i = skipBlank(b, i+1)
	if i < len(b) && b[i] == '}' {
		return i + 1, nil
	}
	for {
		if i >= len(b) || b[i] != '"' {
			return 0, fmt.Errorf("%w: member name expected at %d", ErrMalformedJSON, i)
		}
		start := i
		ne, err := stringEnd(b, i)
		if err != nil {
			return 0, err
		}
		name := b[i+1 : ne-1]
		i = skipBlank(b, ne)
		if i >= len(b) || b[i] != ':' {
			return 0, fmt.Errorf("%w: ':' expected at %d", ErrMalformedJSON, i)
		}
		ve, err := value(name, start, skipBlank(b, i+1))
		if err != nil {
			return 0, err
		}
		i = skipBlank(b, ve)
		switch {
		case i < len(b) && b[i] == ',':
			i = skipBlank(b, i+1)
		case i < len(b) && b[i] == '}':
			return i + 1, nil
		default:
			return 0, fmt.Errorf("%w: ',' or '}' expected at %d", ErrMalformedJSON, i)
		}
	}
}

// skipValue returns the offset just past the value at b[i].
func skipValue(b []byte, i int) (int, error) {
	if i >= len(b) {
		return 0, fmt.Errorf("%w: value expected", ErrMalformedJSON)
	}
	switch b[i] {
	case '"':
		return stringEnd(b, i)
	case '{', '[':
		return skipNested(b, i)
	case ',', '}', ']', ':':
		return 0, fmt.Errorf("%w: value expected at %d", ErrMalformedJSON, i)
	}
	j := i
	for j < len(b) {
		switch b[j] {
		case ',', '}', ']', ' ', '\t', '\r', '\n':
			return j, nil
		case '"', '{', '[', ':':
			return 0, fmt.Errorf("%w: bad scalar at %d", ErrMalformedJSON, i)
		}
		j++
	}
	return j, nil
}

// skipNested returns the offset just past the object or array at b[i],
// matching brackets; strings are skipped with stringEnd. An array of
// scalars only (token ids) is skipped in one jump: when its first ']'
// comes before any '"', and no '[' or '{' comes before that ']', the array
// ends there (found with bytes.IndexByte, once per value: linear).
func skipNested(b []byte, i int) (int, error) {
	if b[i] == '[' {
		rest := b[i+1:]
		if q := bytes.IndexByte(rest, '"'); q >= 0 {
			rest = rest[:q]
		}
		if j := bytes.IndexByte(rest, ']'); j >= 0 && bytes.IndexByte(rest[:j], '[') < 0 && bytes.IndexByte(rest[:j], '{') < 0 {
			return i + 1 + j + 1, nil
		}
	}
	var stack [64]byte
	deep := stack[:0]
	for ; i < len(b); i++ {
		switch c := b[i]; c {
		case '"':
			e, err := stringEnd(b, i)
			if err != nil {
				return 0, err
			}
			i = e - 1
		case '[':
			deep = append(deep, ']')
		case '{':
			deep = append(deep, '}')
		case '}', ']':
			if len(deep) == 0 || deep[len(deep)-1] != c {
				return 0, fmt.Errorf("%w: unbalanced %q at %d", ErrMalformedJSON, c, i)
			}
			deep = deep[:len(deep)-1]
			if len(deep) == 0 {
				return i + 1, nil
			}
		}
	}
	return 0, fmt.Errorf("%w: unterminated object or array", ErrMalformedJSON)
}

// stringEnd returns the offset just past the string whose opening quote is
// at b[i]: the next quote not escaped by an odd run of backslashes.
func stringEnd(b []byte, i int) (int, error) {
	i++
	for {
		j := bytes.IndexByte(b[i:], '"')
		if j < 0 {
			return 0, fmt.Errorf("%w: unterminated string", ErrMalformedJSON)
		}
		q := i + j
		n := 0
		for k := q - 1; k >= i && b[k] == '\\'; k-- {
			n++
		}
		if n%2 == 0 {
			return q + 1, nil
		}
		i = q + 1
	}
}

func skipBlank(b []byte, i int) int {
	for i < len(b) {
		switch b[i] {
		case ' ', '\t', '\r', '\n':
			i++
		default:
			return i
		}
	}
	return i
}

// isObjectAt reports whether the raw value v is an object.
func isObjectAt(v []byte) bool { return len(v) > 0 && v[0] == '{' }

// clientField returns the index of the client connector field the raw
// member name spells (escapes decoded), or -1.
func clientField(raw []byte) int {
	var buf [32]byte
	name, ok := decodeName(buf[:0], raw)
	if !ok {
		return -1
	}
	for i, n := range clientFieldNames {
		if string(name) == n {
			return i
		}
	}
	return -1
}

// nameIs reports whether the raw member name spells want.
func nameIs(raw []byte, want string) bool {
	var buf [32]byte
	name, ok := decodeName(buf[:0], raw)
	return ok && string(name) == want
}

// decodeName decodes the raw member name into dst, which it never grows
// past its capacity: ok is false for a name longer than that (no client
// field name is) or with a bad escape.
func decodeName(dst, raw []byte) ([]byte, bool) {
	if bytes.IndexByte(raw, '\\') < 0 {
		if len(raw) > cap(dst) {
			return nil, false
		}
		return append(dst, raw...), true
	}
	return unescape(dst, raw, cap(dst))
}

// unescape appends the contents of a JSON string (raw, its quotes left
// out) to dst, escapes decoded, growing dst to at most max bytes: ok is
// false past that or at a bad escape. A surrogate pair is the one
// character it stands for, a lone surrogate U+FFFD.
func unescape(dst, raw []byte, max int) ([]byte, bool) {
	for i := 0; i < len(raw); i++ {
		c := raw[i]
		if c == '\\' {
			if i+1 >= len(raw) {
				return nil, false
			}
			i++
			switch raw[i] {
			case '"', '\\', '/':
				c = raw[i]
			case 'b':
				c = '\b'
			case 'f':
				c = '\f'
			case 'n':
				c = '\n'
			case 'r':
				c = '\r'
			case 't':
				c = '\t'
			case 'u':
				r, ok := hex4(raw[i+1:])
				if !ok {
					return nil, false
				}
				i += 4
				if r >= 0xD800 && r < 0xDC00 && i+6 < len(raw) && raw[i+1] == '\\' && raw[i+2] == 'u' {
					if lo, ok := hex4(raw[i+3:]); ok && lo >= 0xDC00 && lo < 0xE000 {
						r = 0x10000 + (r-0xD800)<<10 + (lo - 0xDC00)
						i += 6
					}
				}
				if len(dst)+utf8.UTFMax > max {
					return nil, false
				}
				dst = utf8.AppendRune(dst, r)
				continue
			default:
				return nil, false
			}
		}
		if len(dst) >= max {
			return nil, false
		}
		dst = append(dst, c)
	}
	return dst, true
}

func hex4(b []byte) (rune, bool) {
	if len(b) < 4 {
		return 0, false
	}
	var r rune
	for _, c := range b[:4] {
		switch {
		case c >= '0' && c <= '9':
			r = r<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	return r, true
}

// maxAddrValues bounds the hosts (and ports) one field may name; past it
// the field is refused as a whole.
const maxAddrValues = 8

// ClientAddrs calls allowed with each address (host:port) that the client
// connector fields of body name where an engine of api reads them:
// kv_transfer_params' and ec_transfer_params' remote_host × remote_port
// (also within their remote_prefiller and remote_kv_source objects),
// remote_bootstrap_addr and kv_source.agent, SGLang's bootstrap_host ×
// bootstrap_port, and the inner names found at the top level. Every copy
// of a repeated name counts (an engine may read any of them). It returns
// the first field whose address allowed refuses, or "" when all pass; a
// field that names a host without a usable port, or too many, is refused
// with the address as far as it could be read (allowed gets "host:").
func ClientAddrs(api API, body []byte, allowed func(hostport string) bool) (string, error) {
	var bootHosts, bootPorts [][]byte
	refused := ""
	check := func(field, hp string) {
		if refused == "" && !allowed(hp) {
			refused = field
		}
	}
	_, err := scanTop(body, func(_ []byte, m jsonMember, path int) error {
		if path == pathDescend {
			return nil
		}
		switch i := clientField(m.name); {
		case i < 0:
		case clientFieldNames[i] == "kv_transfer_params" || clientFieldNames[i] == "ec_transfer_params":
			if isObjectAt(m.value) {
				return paramsAddrs(clientFieldNames[i], m.value, check)
			}
		case path == pathTop && clientFieldNames[i] == "bootstrap_host":
			bootHosts = append(bootHosts, m.value)
		case path == pathTop && clientFieldNames[i] == "bootstrap_port":
			bootPorts = append(bootPorts, m.value)
		case clientFieldNames[i] == "remote_bootstrap_addr" || clientFieldNames[i] == "kv_source":
			return innerAddr(clientFieldNames[i], m.value, check)
		}
		return nil
	}, api == APIGenerate)
	if err != nil {
		return "", err
	}
	hostPorts("bootstrap_host", bootHosts, bootPorts, check)
	return refused, nil
}

// paramsAddrs checks the addresses one kv_transfer_params (or
// ec_transfer_params) object names.
func paramsAddrs(field string, obj []byte, check func(field, hp string)) error {
	var hosts, ports [][]byte
	_, err := scanObject(obj, 0, func(m jsonMember) error {
		switch {
		case nameIs(m.name, "remote_host"):
			hosts = append(hosts, m.value)
		case nameIs(m.name, "remote_port"):
			ports = append(ports, m.value)
		case nameIs(m.name, "remote_bootstrap_addr"), nameIs(m.name, "kv_source"):
			return innerAddr(field, m.value, check)
		case isObjectAt(m.value) && (nameIs(m.name, "remote_prefiller") || nameIs(m.name, "remote_kv_source")):
			// The P2P tier's peers (offloading): each its own host and port.
			return paramsAddrs(field, m.value, check)
		}
		return nil
	})
	hostPorts(field, hosts, ports, check)
	return err
}

// innerAddr checks remote_bootstrap_addr (a URL or host:port) or
// kv_source (an object whose agent is host:port).
func innerAddr(field string, v []byte, check func(field, hp string)) error {
	if isObjectAt(v) {
		_, err := scanObject(v, 0, func(m jsonMember) error {
			if nameIs(m.name, "agent") {
				return innerAddr(field, m.value, check)
			}
			return nil
		})
		return err
	}
	addrs, ok := jsonStrings(v)
	if !ok || len(addrs) > maxAddrValues {
		check(field, ":")
		return nil
	}
	for _, a := range addrs {
		if i := strings.Index(a, "://"); i >= 0 {
			a = a[i+3:]
		}
		if i := strings.IndexByte(a, '/'); i >= 0 {
			a = a[:i]
		}
		check(field, a)
	}
	return nil
}

// hostPorts checks every host named (each value a string, an array of
// them, or null) with every port named.
func hostPorts(field string, hostVals, portVals [][]byte, check func(field, hp string)) {
	var hosts, ports []string
	for _, v := range hostVals {
		h, ok := jsonStrings(v)
		if !ok {
			check(field, ":")
			return
		}
		hosts = append(hosts, h...)
	}
	for _, v := range portVals {
		p, ok := jsonPorts(v)
		if !ok {
			check(field, ":")
			return
		}
		ports = append(ports, p...)
	}
	if len(hosts) == 0 {
		return
	}
	if len(hosts) > maxAddrValues || len(ports) > maxAddrValues {
		check(field, ":")
		return
	}
	if len(ports) == 0 {
		ports = []string{""}
	}
	for _, h := range hosts {
		for _, p := range ports {
			check(field, joinHostPort(h, p))
		}
	}
}

func joinHostPort(h, p string) string {
	if strings.IndexByte(h, ':') >= 0 && (len(h) == 0 || h[0] != '[') {
		return "[" + h + "]:" + p
	}
	return h + ":" + p
}

// jsonStrings reads a raw value that is a string, an array of strings
// (nulls skipped) or null.
func jsonStrings(v []byte) ([]string, bool) {
	var one *string
	if err := json.Unmarshal(v, &one); err == nil {
		if one == nil {
			return nil, true
		}
		return []string{*one}, true
	}
	var many []*string
	if err := json.Unmarshal(v, &many); err != nil {
		return nil, false
	}
	out := make([]string, 0, len(many))
	for _, s := range many {
		if s != nil {
			out = append(out, *s)
		}
	}
	return out, true
}

// jsonPorts reads a raw value that is a port number (or a string of one),
// an array of them, or null.
func jsonPorts(v []byte) ([]string, bool) {
	var many []json.RawMessage
	if len(v) > 0 && v[0] == '[' {
		if err := json.Unmarshal(v, &many); err != nil {
			return nil, false
		}
	} else {
		many = []json.RawMessage{v}
	}
	out := make([]string, 0, len(many))
	for _, raw := range many {
		if string(bytes.TrimSpace(raw)) == "null" {
			continue
		}
		var n json.Number
		if err := json.Unmarshal(raw, &n); err != nil {
			var s *string
			if err := json.Unmarshal(raw, &s); err != nil {
				return nil, false
			}
			if s == nil {
				continue
			}
			n = json.Number(*s)
		}
		p, err := strconv.ParseUint(string(n), 10, 16)
		if err != nil {
			return nil, false
		}
		out = append(out, strconv.FormatUint(p, 10))
	}
	return out, true
}
