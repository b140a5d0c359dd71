// Package multiturn is multi-turn KV reuse (--enable-bidirectional-kv-xfer),
// a request feature: the KV a decode engine holds for a conversation's turn
// is pulled by the prefill engine of its next turn instead of computed
// again. vLLM's NixlConnector with bidirectional_kv_xfer pins a decode
// request's blocks (prompt and output) when it finishes and answers their
// location in kv_transfer_params; this package keeps that answer under the
// digest of the sequence the decode engine saw and produced (seq.go), and
// puts it in the prefill leg of the turn whose text extends that sequence
// exactly — found by hashing the turn's own prefixes, so no session key is
// needed, and one shared by many conversations (llm-d's session-affinity
// token names a pod) loses nothing; a key only narrows the search.
package multiturn

import (
	"crypto/sha256"
	"errors"
	"hash"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/rs/zerolog"
	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/connectors/nixlv2"
	"github.com/pd-sidecar/pd-sidecar/metrics"
	"github.com/pd-sidecar/pd-sidecar/proxy/feature"
)

// Feature is multi-turn KV reuse, registered while it is on.
type Feature struct {
	// Store keeps the answers' entries.
	Store *Store
	// Pins estimates the tokens the decode engine holds pinned
	// (nil: not estimated).
	Pins *Pins
	// Release frees the pins no turn will read (nil: they last their
	// TTL; --bidirectional-release-unread).
	Release PinReleaser
	// Threshold is the fewest history tokens worth a pull
	// (--bidirectional-recompute-threshold): a shorter history is not put
	// in the prefill leg.
	Threshold int
	// PodAddr is this pod's IP address (POD_IP, else --host when it names
	// one address; "" when unknown). The side channel an answer names must
	// be this address exactly (an IPv4-mapped IPv6 form of it too, handed
	// on as PodAddr); a host name (VLLM_NIXL_SIDE_CHANNEL_HOST given as
	// the pod's DNS name) is this pod's and is handed on as this address,
	// never as a name the prefill engine would resolve in its own pod; a
	// loopback name (localhost) only when PodAddr is loopback. Unknown: no
	// history is kept, since the prefill engine would dial whatever
	// address was kept in its own pod.
	PodAddr string
	// SideChannelPort is the decode engine's NIXL side-channel port
	// (VLLM_NIXL_SIDE_CHANNEL_PORT; --decode-side-channel-port), rank 0's:
	// rank r's is SideChannelPort+r, as vLLM adds the data-parallel rank.
	// The port an answer names must be one of Ranks ranks'.
	SideChannelPort int
	// Ranks is the number of this pod's data-parallel ranks (at least 1).
	Ranks int
	// KeepReasoning keeps the history of answers with reasoning
	// (--bidirectional-keep-reasoning): only right for chat templates that
	// render past turns' reasoning back into the prompt, as the engine
	// generated it.
	KeepReasoning bool
	// M counts.
	M *metrics.Multiturn
}

// PinReleaser sends, in the background, the release leg of a pin: body
// (ReleaseBody) to the prefill engine at prefiller, which makes it free the
// pin on the decode engine. It never blocks.
type PinReleaser interface {
	ReleasePin(prefiller string, body []byte)
}

// maxModelLen bounds the model name an entry keeps for its release leg:
// a longer one is no served model's, and the pin lasts its TTL.
const maxModelLen = 256

// maxProbes bounds the lengths a turn looks for a history at: the longest
// ones under its own length. A chat's lengths are message counts, fewer
// than that in any conversation; a completion's are byte lengths, one per
// history held under the narrowing.
const maxProbes = 64

// Begin takes part in a split (a request that names a prefiller) whose
// API and shape multi-turn reuse covers (chat and completions, one
// choice): it takes the entry whose sequence its text extends, the longest
// held, for its prefill leg, and follows its decode answer, whose
// kv_transfer_params (when the decode engine pinned its KV) are kept for
// the turn that extends it. A request served locally from the start is
// left alone: its decode leg carries no kv_transfer_params, and the engine
// pins nothing for it.
func (f *Feature) Begin(r feature.Request, _ feature.Head) feature.Use {
	if r.Refused || r.Prefiller == "" {
		return nil
	}
	p, ok := ReadPrompt(r.API, r.Body, r.Session)
	if !ok {
		r.Log.LogAt(zerolog.DebugLevel).Msg("multi-turn: a request shape the history cannot follow (API, prompt, choices): not used, not kept")
		return nil
	}
	u := &use{f: f, narrow: p.Narrow(), client: ClientOf(r.Client), log: r.Log, chat: r.API == connectors.APIChat, n: p.Len(), prefiller: r.Prefiller}
	if m := p.Model(); len(m) <= maxModelLen {
		u.model = m
	}
	sums, seq := p.Prefixes(f.Store.Lengths(u.narrow, p.Len(), maxProbes))
	u.seq = seq
	slices.Reverse(sums) // the longest history first
	u.lookup(sums, p.Continues())
	if u.chat {
		u.content, u.reasoning = sha256.New(), sha256.New()
	}
	return u
}

// use is one request's part.
type use struct {
	f      *Feature
	narrow [sha256.Size]byte
	// prefiller and model are the request's: where and how a release leg
	// of the pin its answer leaves goes.
	prefiller, model string
	// client is whose share the entry the answer leaves counts in.
	client Client
	log    feature.Logger

	// history is the entry's params for the prefill leg (nil: none), of
	// tokens tokens; dropped once the prefill failed with it.
	history []byte
	tokens  int
	dropped bool
	counted bool
	// outcome is HistoryOutcome's: OutcomeUsed or a miss reason.
	outcome string

	// The decode answer, followed piece by piece: seq is the request's
	// sequence's hash (n units); a chat's answer text and reasoning are
	// hashed apart (a message's digest), a completion's text goes into seq.
	chat               bool
	seq                hash.Hash
	n, text            int
	content, reasoning hash.Hash
	finished, broken   bool
	thought            bool // the answer carried reasoning
	done               bool // the entry was kept or refused
}

// lookup takes the entry of the longest of sums (the digests of the
// turn's prefixes at the lengths held) and keeps its params for the
// prefill leg if it holds enough tokens; it counts why not otherwise. An
// entry the turn does not extend stays for the turn that does; one below
// the threshold goes.
func (u *use) lookup(sums [][sha256.Size]byte, continues bool) {
	e, miss := u.f.Store.Take(u.narrow, sums, continues)
	u.f.M.Held.Set(float64(u.f.Store.Count()))
	if miss == "" && e.Tokens < u.f.Threshold {
		miss = metrics.MultiturnBelowThreshold
		u.f.release(e)
	}
	u.outcome = miss
	if miss != "" {
		u.f.M.Misses.WithLabelValues(miss).Inc()
		u.log.LogAt(zerolog.DebugLevel).Str("reason", miss).Msg("multi-turn: no history for this turn's prefill")
		return
	}
	u.history, u.tokens = e.Params, e.Tokens
	u.f.unpin(e) // the prefill reads the pin, and the engine frees it
	u.log.LogAt(zerolog.DebugLevel).Int("history_tokens", e.Tokens).Msg("multi-turn: the prefill pulls the conversation's history from the decode engine")
}

// EditPrefill puts the history's params in the prefill leg, in place of
// the connector's (which ask for a remote decode alone).
func (u *use) EditPrefill(body []byte) ([]byte, error) {
	if u.history == nil || u.dropped {
		return body, nil
	}
	return connectors.EditObject(nil, body, []connectors.Edit{{Key: "kv_transfer_params", Raw: u.history}})
}

// DropPrefillEdit takes the history out of the prefill leg after the
// prefill failed with it (the decode engine's blocks expired or gone, the
// pull failed): counted, and the prefill runs once more without it.
func (u *use) DropPrefillEdit() bool {
	if u.history == nil || u.dropped {
		return false
	}
	u.dropped, u.outcome = true, metrics.MultiturnPullFailed
	u.f.M.Misses.WithLabelValues(metrics.MultiturnPullFailed).Inc()
	u.log.LogAt(zerolog.WarnLevel).Str("reason", metrics.MultiturnPullFailed).Msg("multi-turn: the prefill with the conversation's history failed; prefilling again without it")
	return true
}

// AnswerEdit is editAnswer, the part's edit of the decode answer.
func (u *use) AnswerEdit() func([]byte) []byte { return u.editAnswer }

// editAnswer follows one piece of the decode answer: its text into the
// sequence's hash, its kv_transfer_params kept with the sequence's digest
// once the answer finished. It returns data unchanged: the client never
// gets the params, but it is proxy/hideparams that hides them, from every
// answer, whether this feature follows it or not.
func (u *use) editAnswer(data []byte) []byte {
	if !u.counted {
		u.counted = true
		if u.history != nil && !u.dropped {
			u.outcome = OutcomeUsed
			u.f.M.Uses.Inc()
			u.f.M.TokensReused.Add(float64(u.tokens))
		}
	}
	if u.done {
		return data
	}
	js := connectors.Bytes(data)
	if !u.broken {
		u.follow(js)
	}
	params := gjson.Get(js, "kv_transfer_params")
	if params.Exists() && params.Type != gjson.Null {
		u.keep(params)
	}
	return data
}

// follow reads one piece's choices: a whole answer's message (or text), or
// an event's delta.
func (u *use) follow(js string) {
	choices := gjson.Get(js, "choices")
	if !choices.Exists() {
		return // an event without choices (an error, [DONE])
	}
	choices.ForEach(func(_, c gjson.Result) bool {
		if c.Get("index").Int() != 0 {
			u.broken = true
			return false
		}
		if u.chat {
			m := c.Get("message")
			if !m.Exists() {
				m = c.Get("delta")
			}
			if tc := m.Get("tool_calls"); tc.IsArray() && len(tc.Array()) > 0 {
				u.broken = true // a template renders tool calls its own way
				return false
			}
			u.content.Write([]byte(m.Get("content").String()))
			r := m.Get("reasoning_content")
			if r.Type != gjson.String {
				r = m.Get("reasoning")
			}
			if r.Str != "" {
				u.thought = true
				u.reasoning.Write([]byte(r.Str))
			}
		} else {
			t := c.Get("text").String()
			u.seq.Write([]byte(t))
			u.text += len(t)
		}
		switch fin := c.Get("finish_reason"); {
		case fin.Type == gjson.Null || !fin.Exists():
		case fin.Str == "stop" || fin.Str == "length":
			u.finished = true
		default:
			u.broken = true // aborted, or cut: not what the engine pinned
		}
		return true
	})
}

// Why a decode answer's side channel is refused.
var (
	// errNotOwnHost: the params name a host that is not this pod's address.
	errNotOwnHost = errors.New("kv_transfer_params name a host that is not this pod's address")
	// errNotSideChannel: the params name a port that is not one of the
	// decode engine's NIXL side-channel ports.
	errNotSideChannel = errors.New("kv_transfer_params name a port that is not the decode engine's NIXL side channel")
	// errNoPodAddr: the sidecar knows no address of its pod to check the
	// params' host against.
	errNoPodAddr = errors.New("no pod address (POD_IP, or --host naming one address): multi-turn histories are not kept")
)

// ownSideChannel checks that the side channel canon names (its addrs) is
// this pod's decode engine's: its port one of the engine's side-channel
// ports, its host this pod's address, or a host name given for it; the
// host is then written as PodAddr (a name, or another spelling of the
// address, is never handed to another pod to resolve or read).
func (u *use) ownSideChannel(canon []byte, addrs []connectors.Addr) ([]byte, error) {
	pod, err := netip.ParseAddr(u.f.PodAddr)
	if err != nil {
		return nil, errNoPodAddr
	}
	pod = pod.Unmap()
	if len(addrs) == 0 {
		return nil, errNotOwnHost
	}
	for _, a := range addrs {
		if !u.f.sideChannelPort(a.Port) {
			return nil, errNotSideChannel
		}
		if !ownHost(a.Host, pod) {
			return nil, errNotOwnHost
		}
		if a.Host == u.f.PodAddr {
			continue
		}
		out, err := sjson.SetBytes(canon, "remote_host", u.f.PodAddr)
		if err != nil {
			return nil, errNotOwnHost
		}
		canon = out
	}
	return canon, nil
}

// sideChannelPort reports whether port is the NIXL side-channel port of
// one of this pod's data-parallel ranks.
func (f *Feature) sideChannelPort(port int) bool {
	return port >= f.SideChannelPort && port < f.SideChannelPort+max(f.Ranks, 1)
}

// ownHost reports whether host, as a side channel names it, is this pod
// (whose address is pod): the address itself, or its IPv4-mapped IPv6
// form; a host name, except a loopback one (localhost) where pod is not
// loopback. Any other address is refused, loopback ones included: the
// prefill engine would dial it in its own pod.
func ownHost(host string, pod netip.Addr) bool {
	if h, err := netip.ParseAddr(host); err == nil {
		return h.Unmap() == pod
	}
	return pod.IsLoopback() || !loopbackName(host)
}

// loopbackName reports whether a host name names the loopback interface
// wherever it is resolved: localhost and the names under it (RFC 6761),
// in any letter case, with or without a final dot.
func loopbackName(host string) bool {
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	return host == "localhost" || strings.HasSuffix(host, ".localhost")
}

// keep keeps the answer's params for the turn that extends it, read
// against nixlv2.HistoryParams and their addresses checked; once. The
// tokens they say the engine pinned are counted pinned whether kept or not.
func (u *use) keep(params gjson.Result) {
	u.done = true
	n := params.Get("remote_num_tokens")
	if n.Type == gjson.Number && n.Int() == 0 {
		// vLLM's answer when it pinned no block (remote_block_ids [[]]):
		// nothing to keep, nothing wrong. Another count out of bounds is
		// refused below.
		u.f.M.Entries.WithLabelValues(metrics.MultiturnNotKept).Inc()
		u.log.LogAt(zerolog.DebugLevel).Msg("multi-turn: the decode engine pinned no block for this answer; nothing kept")
		return
	}
	canon, addrs, err := nixlv2.HistoryParams.Canonical(nil, params)
	if err == nil {
		canon, err = u.ownSideChannel(canon, addrs)
	}
	if err == nil && (params.Get("do_remote_decode").Type != gjson.True || params.Get("do_remote_prefill").Type != gjson.False) {
		err = connectors.ErrInvalidKVParams
	}
	if err != nil {
		u.f.M.Entries.WithLabelValues(metrics.MultiturnRefused).Inc()
		if errors.Is(err, errNoPodAddr) { // warned once, at start (proxy/inference's New)
			u.log.LogAt(zerolog.DebugLevel).Err(err).Msg("multi-turn: the decode answer's kv_transfer_params refused; nothing kept")
			return
		}
		u.log.LogAt(zerolog.WarnLevel).Err(err).Msg("multi-turn: the decode answer's kv_transfer_params refused; nothing kept")
		return
	}
	// The engine pinned the answer's tokens: they count until a prefill is
	// given them or the TTL passes.
	// The prefiller and model are copied: the request's strings may be
	// views of buffers that go back to their pools when it ends.
	e := Entry{Params: canon, Tokens: int(n.Int()), Prefiller: strings.Clone(u.prefiller), Model: strings.Clone(u.model)}
	if u.f.Pins != nil {
		e.Pinned = u.f.Pins.Pin(e.Tokens)
		u.f.notePins()
	}
	if u.broken || !u.finished || u.thought && !u.f.KeepReasoning {
		u.f.M.Entries.WithLabelValues(metrics.MultiturnNotKept).Inc()
		u.log.LogAt(zerolog.DebugLevel).Msg("multi-turn: the answer is not one a next turn can extend exactly (choices, tool calls, reasoning, cut); its KV is not kept")
		u.f.release(e)
		return
	}
	h := u.seq
	e.Len = u.n + u.text
	if u.chat {
		h.Write(answerSum(u.content, u.reasoning))
		e.Len = u.n + 1
	}
	h.Sum(e.Seq[:0])
	ev, ok := u.f.Store.Put(u.narrow, u.client, e)
	if !ok {
		u.f.M.Entries.WithLabelValues(metrics.MultiturnNotKept).Inc()
		u.f.release(e)
	} else {
		u.f.M.Entries.WithLabelValues(metrics.MultiturnKept).Inc()
		if ev.Total() > 0 {
			u.f.M.Entries.WithLabelValues(metrics.MultiturnEvicted).Add(float64(ev.Total()))
			u.f.M.Evictions.WithLabelValues(metrics.MultiturnEvictedShare).Add(float64(ev.Share))
			u.f.M.Evictions.WithLabelValues(metrics.MultiturnEvictedOverShare).Add(float64(ev.OverShare))
			u.f.M.Evictions.WithLabelValues(metrics.MultiturnEvictedFull).Add(float64(ev.Full))
		}
		for d := range ev.Dropped() {
			u.f.release(d)
		}
	}
	u.f.M.Held.Set(float64(u.f.Store.Count()))
}

// release has the pin e holds on the decode engine freed, when releases
// are on and e knows its prefiller and model: a turn will never read it.
func (f *Feature) release(e Entry) {
	if f.Release == nil || e.Prefiller == "" || e.Model == "" {
		return
	}
	f.Release.ReleasePin(e.Prefiller, ReleaseBody(e))
	f.unpin(e)
}

// unpin takes e's tokens off the pins counted: a prefill is given them.
func (f *Feature) unpin(e Entry) {
	if f.Pins != nil {
		f.Pins.Release(e.Pinned, e.Tokens)
		f.notePins()
	}
}

// notePins sets the pinned-tokens gauge.
func (f *Feature) notePins() { f.M.PinnedTokens.Set(float64(f.Pins.Tokens())) }

// ReleaseBody is the body of the release leg of e's pin: a completion of
// e's model, one output token, whose kv_transfer_params are e's, as a
// turn's prefill leg would carry them, and whose prompt is a single word.
// The prefill engine that gets it finds the history longer than the
// prompt and nothing worth pulling (min(remote_num_tokens, prompt tokens)
// under kv_recompute_threshold, 64 with bidirectional_kv_xfer), so it
// computes the word itself and sends the decode engine the notify-only
// message that frees the pin (vLLM's NixlPullConnectorScheduler
// get_num_new_matched_tokens and update_state_after_alloc, and the pull
// worker's _read_blocks, vllm-project/vllm
// vllm/distributed/kv_transfer/kv_connector/v1/nixl/pull_scheduler.py at
// 0050936b22adda2ef0197fa3bb2551fe6c5437dc, pull_worker.py at 0316d25). It
// holds its own one block for a decoder that never comes, for its lease
// (kv_lease_duration, 30 s) — against the decode engine's blocks for
// decoder_kv_blocks_ttl (480 s).
func ReleaseBody(e Entry) []byte {
	b := make([]byte, 0, len(e.Params)+len(e.Model)+96)
	b = append(b, `{"model":`...)
	b = strconv.AppendQuote(b, e.Model)
	b = append(b, `,"prompt":"release","max_tokens":1,"stream":false,"kv_transfer_params":`...)
	b = append(b, e.Params...)
	return append(b, '}')
}

// OutcomeUsed is HistoryOutcome's for a turn whose prefill carried the
// history and whose decode answered.
const OutcomeUsed = "used"

// HistoryOutcome is OutcomeUsed, a miss reason, or "" (not a split, or the
// history is in a prefill not yet answered).
func (u *use) HistoryOutcome() string { return u.outcome }

var (
	_ feature.Feature         = (*Feature)(nil)
	_ feature.OptionalPrefill = (*use)(nil)
	_ feature.AnswerEditor    = (*use)(nil)
	_ feature.HistoryReporter = (*use)(nil)
)
