package connectors

import (
	"fmt"
	"math"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"unsafe"

	"github.com/tidwall/gjson"
)

// What an upstream's answer may hand on. A prefill answer's
// kv_transfer_params (and a kv_source descriptor, an encoder's
// ec_transfer_params) tell the decode engine, or the sidecar itself, where
// to connect and what to read there; an engine trusts them as it trusts a
// client's, which the sidecar strips. So a connector never copies them: it
// reads each documented member with its documented type and bounds, refuses
// everything else, and writes a fresh object from the values it read
// (Schema.Canonical). The addresses those values name are returned beside
// it (Addr), for the proxy to check against the allowlist before anything
// connects to them.

// Addr is a network address an upstream's answer names for the decode side
// to connect to: the decode engine (a prefiller's NIXL side channel), or
// the sidecar itself (a kvtransfer agent).
type Addr struct {
	// Field is the member that names it, after its object's name
	// ("kv_transfer_params.remote_host", "kv_source.agent"): a fixed name
	// of the connector's, never the answer's bytes.
	Field string
	// Host is an IP literal (without brackets) or a DNS name.
	Host string
	// Port is the port named with it; 0 when the answer names none.
	Port int
}

// String returns host:port (IPv6 in brackets).
func (a Addr) String() string { return net.JoinHostPort(a.Host, strconv.Itoa(a.Port)) }

// Kind is the documented type of a member of connector params.
type Kind uint8

// The member kinds a Schema reads.
const (
	// KindBool is true or false.
	KindBool Kind = iota + 1
	// KindInt is an integer (no fraction, no exponent) in [Min, Max].
	KindInt
	// KindNumber is any finite JSON number.
	KindNumber
	// KindID is a string of 1..Max bytes (MaxIDLen when Max is 0), each
	// printable ASCII other than a space, a quote or a backslash: an
	// engine, request or transfer id.
	KindID
	// KindHost is an IP literal or a DNS name (see ValidHost).
	KindHost
	// KindHosts is an array of at most Max hosts.
	KindHosts
	// KindHostPort is "host:port", the port in 1..65535.
	KindHostPort
	// KindInts is an array of at most Max integers in [Min, MaxInt64].
	KindInts
	// KindUints is an array of at most Max unsigned 64-bit integers.
	KindUints
	// KindBlockIDs is vLLM's remote_block_ids: an array of integers in
	// [0, MaxInt32] (older vLLM), or an array of at most MaxKVGroups such
	// arrays (one per KV-cache group); at most Max integers in all. A flat
	// array of ids (KindID strings) passes too: the placeholders of
	// llm-d-inference-sim (["DUMMY_ID"]), whose decode side reads them as
	// strings; a real engine cannot use them and fails the KV load, which
	// the proxy recovers from with a local prefill.
	KindBlockIDs
	// KindObject is an object read with Schema Sub.
	KindObject
	// KindMap is an object of at most Max members, each named by a
	// decimal number of 1..5 digits (a rank, a port offset), each an
	// object read with Schema Sub.
	KindMap
	// KindOpaque is any value that names no address (Passable: literals,
	// numbers, strings that could not name an address, and arrays and
	// objects of them), written anew: a member an engine passes between
	// its own stages that the sidecar does not read.
	KindOpaque
)

// Role is what a member is to the addresses the params name.
type Role uint8

// The roles.
const (
	// RoleNone: the member names no address.
	RoleNone Role = iota
	// RoleHost: a host (KindHost) or hosts (KindHosts) the decode side
	// connects to, at each port a RolePort member names.
	RoleHost
	// RolePort: a port (KindInt) of the hosts; 0 names none.
	RolePort
	// RoleAddr: a whole address (KindHostPort).
	RoleAddr
)

// Bounds of what a Schema accepts.
const (
	// MaxIDLen is the longest KindID without a Max of its own.
	MaxIDLen = 256
	// MaxKVGroups bounds the KV-cache groups of remote_block_ids.
	MaxKVGroups = 64
	// maxHostLen is a DNS name's longest form.
	maxHostLen = 253
	// maxFields bounds a Schema (one bit each in a word).
	maxFields = 64
)

// Field is one documented member.
type Field struct {
	Name     string
	Kind     Kind
	Required bool // else it may be absent, or null (kept as null)
	Min, Max int64
	Role     Role
	Sub      *Schema // KindObject
}

// Schema is the documented shape of a connector's params object.
type Schema struct {
	// Name names the object in errors and addresses ("kv_transfer_params",
	// "kv_source").
	Name   string
	Fields []Field
	// Open lets members the schema does not document pass, when each is
	// one an engine may add without it naming an address (Passable): they
	// are written after the documented ones, anew, and reported
	// (Checked.Unknown) for the proxy to count, or to refuse. A closed
	// schema (false) refuses every member it does not document.
	Open bool
}

// Checked is what Schema.Check read.
type Checked struct {
	// Out is the object written anew (appended to the dst given).
	Out []byte
	// Addrs are the addresses the documented members name.
	Addrs []Addr
	// Unknown are the names of the members an Open schema let pass, in
	// the answer's order.
	Unknown []string
}

// invalid is ErrInvalidKVParams with a fixed reason: the schema's names,
// never the answer's bytes.
func (s *Schema) invalid(field, why string) error {
	if field == "" {
		return fmt.Errorf("%w: %s: %s", ErrInvalidKVParams, s.Name, why)
	}
	return fmt.Errorf("%w: %s.%s: %s", ErrInvalidKVParams, s.Name, field, why)
}

// Canonical reads the JSON object v against s: well-formed (ValidObject),
// only the members s documents, each once, their names unescaped, each of
// its kind and within its bounds, the required ones present. It appends to
// dst a new object written from the values read (members in s's order;
// nothing of v's bytes is copied), and returns the addresses it names:
// every RoleAddr value, and every RoleHost host at every non-zero RolePort
// port (at port 0 when none is). Anything else is ErrInvalidKVParams with
// a fixed reason.
func (s *Schema) Canonical(dst []byte, v gjson.Result) ([]byte, []Addr, error) {
	c, err := s.Check(dst, v)
	return c.Out, c.Addrs, err
}

// Check is Canonical, and with an Open schema it also lets pass the
// members s does not document that Passable takes (each name once, a
// plain identifier), written anew after the documented ones in the
// answer's order and named in Unknown. On an error Out is dst.
func (s *Schema) Check(dst []byte, v gjson.Result) (Checked, error) {
	out, addrs, unknown, err := s.check(dst, v)
	if err != nil {
		return Checked{Out: dst}, err
	}
	return Checked{Out: out, Addrs: addrs, Unknown: unknown}, nil
}

func (s *Schema) check(dst []byte, v gjson.Result) ([]byte, []Addr, []string, error) {
	// v.Raw is only read: viewed as bytes, not copied.
	if !v.IsObject() || ValidObject(unsafe.Slice(unsafe.StringData(v.Raw), len(v.Raw))) != nil {
		return dst, nil, nil, s.invalid("", "not a well-formed JSON object")
	}
	if len(s.Fields) > maxFields {
		return dst, nil, nil, s.invalid("", "schema too large") // a programming error
	}
	var buf [32]gjson.Result // on the stack: every schema here has fewer fields
	vals := buf[:0]
	if len(s.Fields) > len(buf) {
		vals = make([]gjson.Result, 0, len(s.Fields))
	}
	vals = vals[:len(s.Fields)]
	var seen uint64
	var err error
	var extra []unknownMember
	v.ForEach(func(k, val gjson.Result) bool {
		if strings.IndexByte(k.Raw, '\\') >= 0 {
			err = s.invalid("", "a member name with escapes")
			return false
		}
		i := s.index(k.Str)
		switch {
		case i < 0 && s.Open:
			extra, err = s.addUnknown(extra, k.Str, val)
		case i < 0:
			err = s.invalid("", "a member outside the connector's documented fields")
		case seen&(1<<i) != 0:
			err = s.invalid(s.Fields[i].Name, "given twice")
		default:
			seen |= 1 << i
			vals[i] = val
		}
		return err == nil
	})
	if err != nil {
		return dst, nil, nil, err
	}
	// Written anew, it is at most as long as v but for the numbers
	// rewritten (a float's digits): room for it at once.
	w := canonWriter{dst: append(slices.Grow(dst, len(v.Raw)+32), '{')}
	var hosts []Addr // port to come
	var ports []int
	var addrs []Addr
	for i := range s.Fields {
		f := &s.Fields[i]
		val := vals[i]
		if seen&(1<<i) == 0 {
			if f.Required {
				return dst, nil, nil, s.invalid(f.Name, "missing")
			}
			continue
		}
		if val.Type == gjson.Null {
			if f.Required {
				return dst, nil, nil, s.invalid(f.Name, "null")
			}
			w.member(f.Name)
			w.dst = append(w.dst, "null"...)
			continue
		}
		w.member(f.Name)
		got, err := w.value(s, f, val)
		if err != nil {
			return dst, nil, nil, err
		}
		switch f.Role {
		case RoleHost:
			for _, h := range got.strs {
				hosts = append(hosts, Addr{Field: s.Name + "." + f.Name, Host: h})
			}
		case RolePort:
			if got.n > 0 {
				ports = append(ports, int(got.n))
			}
		case RoleAddr:
			addrs = append(addrs, Addr{Field: s.Name + "." + f.Name, Host: got.strs[0], Port: int(got.n)})
		}
		addrs = append(addrs, got.addrs...)
	}
	var unknown []string
	for _, u := range extra {
		w.member(u.name)
		w.dst = u.write(w.dst)
		unknown = append(unknown, u.name)
	}
	w.dst = append(w.dst, '}')
	if len(ports) == 0 {
		ports = []int{0}
	}
	for _, h := range hosts {
		for _, p := range ports {
			h.Port = p
			addrs = append(addrs, h)
		}
	}
	return w.dst, addrs, unknown, nil
}

func (s *Schema) index(name string) int {
	for i := range s.Fields {
		if s.Fields[i].Name == name {
			return i
		}
	}
	return -1
}

// canonWriter writes a canonical object member by member.
type canonWriter struct {
	dst []byte
	n   int
}

// appendQuoted appends s quoted as JSON reads it: printable ASCII other
// than a quote or a backslash as it is, which is all a checked id, host
// or schema name holds; anything else as strconv.AppendQuote writes it.
func appendQuoted(dst []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' {
			return strconv.AppendQuote(dst, s)
		}
	}
	dst = append(dst, '"')
	dst = append(dst, s...)
	return append(dst, '"')
}

func (w *canonWriter) member(name string) {
	if w.n > 0 {
		w.dst = append(w.dst, ',')
	}
	w.n++
	w.dst = appendQuoted(w.dst, name) // a schema's own name: plain ASCII
	w.dst = append(w.dst, ':')
}

// read is what a member's value said, for the addresses.
type read struct {
	n     int64    // KindInt, KindHostPort's port
	strs  []string // KindHost(s), KindHostPort's host
	addrs []Addr   // KindObject's own
}

// value checks val against f and writes it.
func (w *canonWriter) value(s *Schema, f *Field, val gjson.Result) (read, error) {
	bad := func(why string) (read, error) { return read{}, s.invalid(f.Name, why) }
	switch f.Kind {
	case KindBool:
		if val.Type != gjson.True && val.Type != gjson.False {
			return bad("not a boolean")
		}
		w.dst = strconv.AppendBool(w.dst, val.Type == gjson.True)
	case KindInt:
		n, ok := intIn(val, f.Min, f.Max)
		if !ok {
			return bad(fmt.Sprintf("not an integer in %d..%d", f.Min, f.Max))
		}
		w.dst = strconv.AppendInt(w.dst, n, 10)
		return read{n: n}, nil
	case KindNumber:
		if val.Type != gjson.Number {
			return bad("not a number")
		}
		x, err := strconv.ParseFloat(val.Raw, 64)
		if err != nil || math.IsInf(x, 0) || math.IsNaN(x) {
			return bad("not a finite number")
		}
		w.dst = strconv.AppendFloat(w.dst, x, 'g', -1, 64)
	case KindID:
		max := f.Max
		if max == 0 {
			max = MaxIDLen
		}
		if val.Type != gjson.String || !validID(val.Str, int(max)) {
			return bad(fmt.Sprintf("not an id of 1..%d printable ASCII characters", max))
		}
		w.dst = appendQuoted(w.dst, val.Str)
	case KindHost:
		if val.Type != gjson.String || !ValidHost(val.Str) {
			return bad("not an IP address or a DNS name")
		}
		w.dst = appendQuoted(w.dst, val.Str)
		return read{strs: []string{unbracket(val.Str)}}, nil
	case KindHosts:
		return w.hosts(s, f, val)
	case KindHostPort:
		host, port, ok := hostPort(val)
		if !ok {
			return bad("not host:port")
		}
		w.dst = appendQuoted(w.dst, val.Str)
		return read{n: int64(port), strs: []string{host}}, nil
	case KindInts, KindUints:
		if !val.IsArray() {
			return bad("not an array")
		}
		return read{}, w.ints(s, f, val)
	case KindBlockIDs:
		return read{}, w.blockIDs(s, f, val)
	case KindMap:
		return w.objectMap(s, f, val)
	case KindOpaque:
		if why := Passable(val); why != "" {
			return bad("a value that " + why)
		}
		w.dst = writeOpaque(w.dst, val)
	case KindObject:
		if f.Sub == nil || !val.IsObject() {
			return bad("not an object")
		}
		out, addrs, err := f.Sub.Canonical(w.dst, val)
		if err != nil {
			return read{}, err
		}
		w.dst = out
		return read{addrs: addrs}, nil
	default:
		return bad("of no documented kind")
	}
	return read{}, nil
}

func (w *canonWriter) hosts(s *Schema, f *Field, val gjson.Result) (read, error) {
	if !val.IsArray() {
		return read{}, s.invalid(f.Name, "not an array")
	}
	var out []string
	var err error
	w.dst = append(w.dst, '[')
	val.ForEach(func(_, h gjson.Result) bool {
		switch {
		case int64(len(out)) >= f.Max:
			err = s.invalid(f.Name, fmt.Sprintf("more than %d hosts", f.Max))
		case h.Type != gjson.String || !ValidHost(h.Str):
			err = s.invalid(f.Name, "an entry that is not an IP address or a DNS name")
		default:
			if len(out) > 0 {
				w.dst = append(w.dst, ',')
			}
			w.dst = appendQuoted(w.dst, h.Str)
			out = append(out, unbracket(h.Str))
		}
		return err == nil
	})
	w.dst = append(w.dst, ']')
	return read{strs: out}, err
}

func (w *canonWriter) ints(s *Schema, f *Field, val gjson.Result) error {
	n := int64(0)
	var err error
	w.dst = append(w.dst, '[')
	val.ForEach(func(_, x gjson.Result) bool {
		if n >= f.Max {
			err = s.invalid(f.Name, fmt.Sprintf("more than %d entries", f.Max))
			return false
		}
		if n > 0 {
			w.dst = append(w.dst, ',')
		}
		n++
		if f.Kind == KindUints {
			u, e := strconv.ParseUint(x.Raw, 10, 64)
			if x.Type != gjson.Number || e != nil {
				err = s.invalid(f.Name, "an entry that is not an unsigned 64-bit integer")
				return false
			}
			w.dst = strconv.AppendUint(w.dst, u, 10)
			return true
		}
		i, ok := intIn(x, f.Min, math.MaxInt64)
		if !ok {
			err = s.invalid(f.Name, fmt.Sprintf("an entry that is not an integer of at least %d", f.Min))
			return false
		}
		w.dst = strconv.AppendInt(w.dst, i, 10)
		return true
	})
	w.dst = append(w.dst, ']')
	return err
}

// blockIDs reads a flat list of block ids, or a list of them per KV group.
// The object was validated (Canonical), so the array's bytes are walked
// as they are, without a JSON parser: a prefill of a long prompt names
// tens of thousands of blocks.
func (w *canonWriter) blockIDs(s *Schema, f *Field, val gjson.Result) error {
	if !val.IsArray() {
		return s.invalid(f.Name, "not an array")
	}
	raw := val.Raw
	depth, total, groups := 0, int64(0), 0
	nested := -1          // unknown until the first entry: 0 ids, 1 lists of ids, 2 placeholder ids
	first := []bool{true} // per depth: no entry written yet
	for i := 0; i < len(raw); i++ {
		switch c := raw[i]; {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
		case c == '[':
			if depth == 1 {
				if nested == 0 || nested == 2 {
					return s.invalid(f.Name, "block ids and lists of them mixed")
				}
				nested = 1
				if groups++; groups > MaxKVGroups {
					return s.invalid(f.Name, fmt.Sprintf("more than %d KV-cache groups", MaxKVGroups))
				}
				w.sep(first, depth)
			}
			if depth++; depth > 2 {
				return s.invalid(f.Name, "nested deeper than a list per KV-cache group")
			}
			first = append(first[:depth], true)
			w.dst = append(w.dst, '[')
		case c == ']':
			depth--
			w.dst = append(w.dst, ']')
		case c == ',':
		case c == '"' && depth == 1 && (nested == -1 || nested == 2):
			// A placeholder id: validated JSON, so the string ends at the
			// next quote when it holds no escape (an id never does).
			j := strings.IndexByte(raw[i+1:], '"')
			if j < 0 || !validID(raw[i+1:i+1+j], MaxIDLen) {
				return s.invalid(f.Name, "a placeholder block id that is not an id")
			}
			nested = 2
			if total++; total > f.Max {
				return s.invalid(f.Name, fmt.Sprintf("more than %d block ids", f.Max))
			}
			w.sep(first, depth)
			w.dst = append(w.dst, raw[i:i+j+2]...)
			i += j + 1
		case c >= '0' && c <= '9' && nested == 2:
			return s.invalid(f.Name, "block ids and placeholders mixed")
		case c >= '0' && c <= '9':
			j := i
			for j < len(raw) && raw[j] >= '0' && raw[j] <= '9' {
				j++
			}
			if j < len(raw) && (raw[j] == '.' || raw[j] == 'e' || raw[j] == 'E') || j-i > 10 {
				return s.invalid(f.Name, "a block id that is not an integer in 0..2147483647")
			}
			// Validated JSON has no leading zeros: the digits are the
			// id's own canonical form, once its range is checked.
			if d := raw[i:j]; len(d) == 10 && d > "2147483647" {
				return s.invalid(f.Name, "a block id that is not an integer in 0..2147483647")
			}
			if depth == 1 {
				if nested == 1 {
					return s.invalid(f.Name, "block ids and lists of them mixed")
				}
				nested = 0
			}
			if total++; total > f.Max {
				return s.invalid(f.Name, fmt.Sprintf("more than %d block ids", f.Max))
			}
			w.sep(first, depth)
			w.dst = append(w.dst, raw[i:j]...)
			i = j - 1
		default:
			return s.invalid(f.Name, "a block id that is not an integer in 0..2147483647")
		}
	}
	return nil
}

// objectMap reads a KindMap: members named by decimal numbers, each an
// object read with f.Sub, whose addresses it returns.
func (w *canonWriter) objectMap(s *Schema, f *Field, val gjson.Result) (read, error) {
	if f.Sub == nil || !val.IsObject() {
		return read{}, s.invalid(f.Name, "not an object")
	}
	var out read
	var err error
	var names []string
	w.dst = append(w.dst, '{')
	val.ForEach(func(k, x gjson.Result) bool {
		switch {
		case int64(len(names)) >= f.Max:
			err = s.invalid(f.Name, fmt.Sprintf("more than %d members", f.Max))
		case k.Raw != `"`+k.Str+`"` || len(k.Str) == 0 || len(k.Str) > 5 || strings.Trim(k.Str, "0123456789") != "":
			err = s.invalid(f.Name, "a member not named by a decimal number")
		case slices.Contains(names, k.Str):
			err = s.invalid(f.Name, "a member given twice")
		case !x.IsObject():
			err = s.invalid(f.Name, "a member that is not an object")
		}
		if err != nil {
			return false
		}
		if len(names) > 0 {
			w.dst = append(w.dst, ',')
		}
		names = append(names, k.Str)
		w.dst = append(appendQuoted(w.dst, k.Str), ':')
		var addrs []Addr
		w.dst, addrs, err = f.Sub.Canonical(w.dst, x)
		out.addrs = append(out.addrs, addrs...)
		return err == nil
	})
	w.dst = append(w.dst, '}')
	return out, err
}

// sep writes the comma before an entry at depth, but for the first.
func (w *canonWriter) sep(first []bool, depth int) {
	if first[depth] {
		first[depth] = false
		return
	}
	w.dst = append(w.dst, ',')
}

// intIn reads v as an integer (digits only: no fraction or exponent) in
// [min, max].
func intIn(v gjson.Result, min, max int64) (int64, bool) {
	if v.Type != gjson.Number {
		return 0, false
	}
	n, err := strconv.ParseInt(v.Raw, 10, 64)
	return n, err == nil && n >= min && n <= max
}

// ValidID reports whether s is an id a KindID member takes: 1..MaxIDLen
// bytes of printable ASCII other than a space, a quote or a backslash.
func ValidID(s string) bool { return validID(s, MaxIDLen) }

// validID reports whether s is 1..max bytes of printable ASCII other than
// a space, a quote or a backslash (written as JSON, it needs no escape).
func validID(s string, max int) bool {
	if len(s) == 0 || len(s) > max {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c > '~' || c == '"' || c == '\\' {
			return false
		}
	}
	return true
}

// ValidHost reports whether h is an IP literal (IPv6 bare or in brackets,
// without a zone) or a DNS name: dot-separated labels of letters, digits
// and inner hyphens, 1..63 bytes each, 253 in all.
func ValidHost(h string) bool {
	if len(h) == 0 || len(h) > maxHostLen {
		return false
	}
	if ip, err := netip.ParseAddr(unbracket(h)); err == nil {
		return ip.Zone() == "" && (h[0] != '[' || ip.Is6())
	}
	for _, label := range strings.Split(strings.TrimSuffix(h, "."), ".") {
		if len(label) == 0 || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-') {
				return false
			}
		}
	}
	return true
}

func unbracket(h string) string {
	if len(h) > 1 && h[0] == '[' && h[len(h)-1] == ']' {
		return h[1 : len(h)-1]
	}
	return h
}

// hostPort reads a "host:port" string value.
func hostPort(v gjson.Result) (string, int, bool) {
	if v.Type != gjson.String || len(v.Str) > maxHostLen+8 {
		return "", 0, false
	}
	h, p, err := net.SplitHostPort(v.Str)
	if err != nil || !ValidHost(h) {
		return "", 0, false
	}
	port, err := strconv.Atoi(p)
	if err != nil || port < 1 || port > 65535 || strconv.Itoa(port) != p {
		return "", 0, false
	}
	return h, port, true
}

// ReadHandoff completes h, read from a prefill answer, with its
// kv_transfer_params value params: read against s (Schema.Check) into
// Params, Addrs and Unknown, TPSize from its tp_size, and CachedTokens
// from its remote_num_cached_tokens when the prefill engine names it
// (the prompt tokens it found in its own prefix cache). Params whose
// do_remote_prefill is not true hand nothing off: ErrInvalidKVParams.
func ReadHandoff(h Handoff, params gjson.Result, s *Schema) (Handoff, error) {
	c, err := s.Check(nil, params)
	if err != nil {
		return h, err
	}
	// One pass over the object written anew (each member once, checked)
	// for the three members the handoff reads.
	var remote, tp, cached gjson.Result
	gjson.Parse(Bytes(c.Out)).ForEach(func(k, v gjson.Result) bool {
		switch k.Str {
		case "do_remote_prefill":
			remote = v
		case "tp_size":
			tp = v
		case "remote_num_cached_tokens":
			cached = v
		}
		return true
	})
	if remote.Type != gjson.True {
		return h, s.invalid("do_remote_prefill", "not true")
	}
	h.Params, h.Addrs, h.Unknown = c.Out, c.Addrs, c.Unknown
	h.TPSize = int(tp.Int())
	if cached.Type == gjson.Number {
		h.CachedTokens = cached.Int()
	}
	return h, nil
}
