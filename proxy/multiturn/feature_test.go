package multiturn

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/metrics"
	"github.com/pd-sidecar/pd-sidecar/proxy/feature"
)

type nopLog struct{}

func (nopLog) LogAt(zerolog.Level) *zerolog.Event { return nil }

const decodeParams = `{"do_remote_prefill":false,"do_remote_decode":true,"remote_block_ids":[[1,2,3]],"remote_engine_id":"d-1","remote_request_id":"r-1","remote_host":"127.0.0.1","remote_port":5600,"tp_size":1,"remote_num_tokens":%d,"remote_blocks_expiry_time":123.5,"transfer_mode":"pull"}`

func newFeature() *Feature {
	return &Feature{
		Store: NewStore(StoreConfig{MaxEntries: 16, MaxBytes: 1 << 20, ClientShare: 0.25, TTL: time.Minute}), Threshold: 64,
		PodAddr: "127.0.0.1", SideChannelPort: 5600, Ranks: 1,
		KeepReasoning: true,
		M:             metrics.NewMultiturn(prometheus.NewRegistry()),
	}
}

func chatBody(msgs ...map[string]any) []byte {
	b, _ := json.Marshal(map[string]any{"model": "m", "messages": msgs, "max_tokens": 8})
	return b
}

func msg(role, content string) map[string]any {
	return map[string]any{"role": role, "content": content}
}

// turn runs one request through the feature as a split: its prefill body
// and its decode answer pieces; it returns the prefill leg's
// kv_transfer_params and what the client got of each piece.
func turn(f *Feature, session string, api connectors.API, body []byte, pieces ...string) (string, []string) {
	u, _ := f.Begin(feature.Request{API: api, Body: body, Prefiller: "10.0.0.1:8000", Session: session, Log: nopLog{}}, nil).(*use)
	if u == nil {
		return "", nil
	}
	pre, _ := u.EditPrefill([]byte(`{"kv_transfer_params":{"do_remote_decode":true}}`))
	var out []string
	for _, p := range pieces {
		out = append(out, string(u.editAnswer([]byte(p))))
	}
	return gjson.GetBytes(pre, "kv_transfer_params").Raw, out
}

func chatAnswer(content, reasoning string, tokens int) string {
	m := map[string]any{"role": "assistant", "content": content}
	if reasoning != "" {
		m["reasoning_content"] = reasoning
	}
	b, _ := json.Marshal(map[string]any{"choices": []any{map[string]any{"index": 0, "message": m, "finish_reason": "length"}},
		"kv_transfer_params": json.RawMessage(fmt.Sprintf(decodeParams, tokens))})
	return string(b)
}

// TestHistoryUsedOnlyWhenTheTurnExtendsTheSequence: turn 2's prefill
// carries turn 1's decode params only when its messages are turn 1's, its
// answer (reasoning included) and more, under the same rendering members
// and the same session key (none included); every other case is a counted
// miss: prefix_mismatch when histories are held under the turn's model,
// tenant and key but it extends none of them, no_entry when none are.
func TestHistoryUsedOnlyWhenTheTurnExtendsTheSequence(t *testing.T) {
	t1 := []map[string]any{msg("system", "be brief"), msg("user", "hello there")}
	answer := map[string]any{"role": "assistant", "content": " ba ko", "reasoning_content": " think"}
	stripped := map[string]any{"role": "assistant", "content": " ba ko"}
	next := msg("user", "and then?")
	tests := []struct {
		name    string
		session string
		tokens  int
		body    []byte
		want    string // "used" or a miss reason
	}{
		{"extends exactly", "s1", 500, chatBody(t1[0], t1[1], answer, next), OutcomeUsed},
		{"reasoning stripped", "s1", 500, chatBody(t1[0], t1[1], stripped, next), metrics.MultiturnPrefixMismatch},
		{"an earlier message edited", "s1", 500, chatBody(t1[0], msg("user", "hello there!"), answer, next), metrics.MultiturnPrefixMismatch},
		{"nothing new", "s1", 500, chatBody(t1[0], t1[1], answer), metrics.MultiturnPrefixMismatch},
		{"another conversation's session key", "s1", 500, chatBody(msg("user", "something else"), answer, next), metrics.MultiturnPrefixMismatch},
		{"another model", "s1", 500, []byte(strings.Replace(string(chatBody(t1[0], t1[1], answer, next)), `"model":"m"`, `"model":"n"`, 1)), metrics.MultiturnNoEntry},
		{"another tenant (cache_salt)", "s1", 500, []byte(strings.Replace(string(chatBody(t1[0], t1[1], answer, next)), `"model":"m"`, `"model":"m","cache_salt":"b"`, 1)), metrics.MultiturnNoEntry},
		{"another session: a key narrows the search", "s2", 500, chatBody(t1[0], t1[1], answer, next), metrics.MultiturnNoEntry},
		{"below the threshold", "s1", 63, chatBody(t1[0], t1[1], answer, next), metrics.MultiturnBelowThreshold},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFeature()
			_, got := turn(f, "s1", connectors.APIChat, chatBody(t1...), chatAnswer(" ba ko", " think", tc.tokens))
			assert.Equal(t, "d-1", gjson.Get(got[0], "kv_transfer_params.remote_engine_id").String(), "passed on as they came: proxy/hideparams hides them")
			assert.Equal(t, 1.0, testutil.ToFloat64(f.M.Entries.WithLabelValues(metrics.MultiturnKept)))
			missesBefore := testutil.ToFloat64(f.M.Misses.WithLabelValues(tc.want))
			u := f.Begin(feature.Request{API: connectors.APIChat, Body: tc.body, Prefiller: "p:1", Session: tc.session, Log: nopLog{}}, nil).(*use)
			pre, err := u.EditPrefill([]byte(`{"kv_transfer_params":{"do_remote_decode":true}}`))
			require.NoError(t, err)
			u.editAnswer([]byte(`{"choices":[]}`))
			assert.Equal(t, tc.want, u.HistoryOutcome())
			if tc.want == OutcomeUsed {
				assert.Equal(t, "d-1", gjson.GetBytes(pre, "kv_transfer_params.remote_engine_id").String())
				assert.Equal(t, 1.0, testutil.ToFloat64(f.M.Uses))
				assert.Equal(t, float64(tc.tokens), testutil.ToFloat64(f.M.TokensReused))
			} else {
				assert.Equal(t, `{"do_remote_decode":true}`, gjson.GetBytes(pre, "kv_transfer_params").Raw)
				assert.Equal(t, missesBefore+1, testutil.ToFloat64(f.M.Misses.WithLabelValues(tc.want)))
			}
		})
	}
}

// TestStreamedAnswerIsFollowedEventByEvent: the answer's text and
// reasoning come in deltas and the params in the last event; the next
// turn that carries them back verbatim uses the history, once.
func TestStreamedAnswerIsFollowedEventByEvent(t *testing.T) {
	f := newFeature()
	t1 := []map[string]any{msg("user", "hi")}
	events := []string{
		`{"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}`,
		`{"choices":[{"index":0,"delta":{"reasoning_content":" hm"},"finish_reason":null}]}`,
		`{"choices":[{"index":0,"delta":{"content":" yo"},"finish_reason":null}]}`,
		`{"choices":[{"index":0,"delta":{"content":" la"},"finish_reason":"stop"}],"kv_transfer_params":` + fmt.Sprintf(decodeParams, 300) + `}`,
		`{"choices":[],"usage":{"prompt_tokens":3}}`,
	}
	_, got := turn(f, "s", connectors.APIChat, chatBody(t1...), events...)
	assert.Equal(t, events, got, "the pieces are passed on as they came: proxy/hideparams hides the params")
	two := chatBody(t1[0], map[string]any{"role": "assistant", "content": " yo la", "reasoning_content": " hm"}, msg("user", "more"))
	pre, _ := turn(f, "s", connectors.APIChat, two, `{"choices":[]}`)
	assert.Contains(t, pre, `"remote_request_id":"r-1"`)
	pre, _ = turn(f, "s", connectors.APIChat, two, `{"choices":[]}`)
	assert.NotContains(t, pre, "remote_request_id", "an entry is used once")
}

// TestCompletionHistory: a completion's next prompt must begin with the
// prompt and the answer's text.
func TestCompletionHistory(t *testing.T) {
	for _, tc := range []struct {
		name, next string
		used       bool
	}{
		{"prompt and answer, then more", "Once upon a time there was\nNext:", true},
		{"answer edited", "Once upon a time there is\nNext:", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFeature()
			ans := `{"choices":[{"index":0,"text":" there was","finish_reason":"length"}],"kv_transfer_params":` + fmt.Sprintf(decodeParams, 100) + `}`
			turn(f, "c", connectors.APICompletions, []byte(`{"model":"m","prompt":"Once upon a time"}`), ans)
			pre, _ := turn(f, "c", connectors.APICompletions, []byte(`{"model":"m","prompt":`+fmt.Sprintf("%q", tc.next)+`}`), `{"choices":[]}`)
			assert.Equal(t, tc.used, strings.Contains(pre, "remote_request_id"))
		})
	}
}

// TestAnswersThatAreNotKept: params naming another host, or a member
// outside the documented set, are refused; an answer with tool calls, more
// than one choice, or cut, is not kept.
func TestAnswersThatAreNotKept(t *testing.T) {
	good := fmt.Sprintf(decodeParams, 100)
	tests := []struct {
		name, answer, outcome string
	}{
		{"another host", `{"choices":[{"index":0,"message":{"content":"x"},"finish_reason":"stop"}],"kv_transfer_params":` + strings.Replace(good, "127.0.0.1", "10.9.9.9", 1) + `}`, metrics.MultiturnRefused},
		{"an undocumented member naming an address", `{"choices":[{"index":0,"message":{"content":"x"},"finish_reason":"stop"}],"kv_transfer_params":` + strings.Replace(good, `"tp_size"`, `"evil":"10.9.9.9:22","tp_size"`, 1) + `}`, metrics.MultiturnRefused},
		{"not a decode's own", `{"choices":[{"index":0,"message":{"content":"x"},"finish_reason":"stop"}],"kv_transfer_params":` + strings.Replace(good, `"do_remote_decode":true`, `"do_remote_decode":false`, 1) + `}`, metrics.MultiturnRefused},
		{"tool calls", `{"choices":[{"index":0,"message":{"content":"","tool_calls":[{"id":"1"}]},"finish_reason":"tool_calls"}],"kv_transfer_params":` + good + `}`, metrics.MultiturnNotKept},
		{"two choices", `{"choices":[{"index":0,"message":{"content":"x"},"finish_reason":"stop"},{"index":1,"message":{"content":"y"},"finish_reason":"stop"}],"kv_transfer_params":` + good + `}`, metrics.MultiturnNotKept},
		{"reasoning, not kept by default", `{"choices":[{"index":0,"message":{"content":"x","reasoning_content":"hm"},"finish_reason":"stop"}],"kv_transfer_params":` + good + `}`, metrics.MultiturnNotKept},
		{"aborted", `{"choices":[{"index":0,"message":{"content":"x"},"finish_reason":"abort"}],"kv_transfer_params":` + good + `}`, metrics.MultiturnNotKept},
		{"no block pinned (vLLM's remote_num_tokens 0)", `{"choices":[{"index":0,"message":{"content":"x"},"finish_reason":"stop"}],"kv_transfer_params":` +
			strings.Replace(fmt.Sprintf(decodeParams, 0), `[[1,2,3]]`, `[[]]`, 1) + `}`, metrics.MultiturnNotKept},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFeature()
			f.KeepReasoning = false
			_, got := turn(f, "s", connectors.APIChat, chatBody(msg("user", "q")), tc.answer)
			assert.Equal(t, 1.0, testutil.ToFloat64(f.M.Entries.WithLabelValues(tc.outcome)))
			assert.Equal(t, 0, f.Store.Count())
			assert.Equal(t, tc.answer, got[0], "passed on as it came: proxy/hideparams hides the params")
		})
	}
}

// TestSideChannelHostName: a decode engine whose side channel is given by
// a host name (VLLM_NIXL_SIDE_CHANNEL_HOST as the pod's DNS name) is this
// pod's: the entry is kept with the pod's own address, never the name.
func TestSideChannelHostName(t *testing.T) {
	f := newFeature()
	f.PodAddr = "10.0.0.7"
	ans := `{"choices":[{"index":0,"message":{"content":"x"},"finish_reason":"stop"}],"kv_transfer_params":` + strings.Replace(fmt.Sprintf(decodeParams, 100), "127.0.0.1", "decode-0.pool.svc", 1) + `}`
	turn(f, "s", connectors.APIChat, chatBody(msg("user", "q")), ans)
	require.Equal(t, 1, f.Store.Count())
	pre, _ := turn(f, "s", connectors.APIChat, chatBody(msg("user", "q"), msg("assistant", "x"), msg("user", "more")), `{"choices":[]}`)
	assert.Equal(t, "10.0.0.7", gjson.Get(pre, "remote_host").Str, "the next prefill leg names this pod's address: %s", pre)
	assert.NotContains(t, pre, "decode-0")
}

// TestSideChannelIsThePodsDecodeEngine: a decode answer's history is kept
// only when its side channel is this pod's decode engine's: the host this
// pod's address exactly (an IPv4-mapped form of it handed on as the
// address; a host name handed on as the address; loopback addresses and
// names only when the pod's address is loopback) and the port the
// engine's NIXL side channel, rank 0's or another data-parallel rank's.
// Without a pod address nothing is kept.
func TestSideChannelIsThePodsDecodeEngine(t *testing.T) {
	tests := []struct {
		name, pod  string
		ranks      int
		host       string
		port       int
		handedOn   string // the next prefill leg's remote_host; "": refused
		refusedFor string
	}{
		{"the pod's address and side channel", "10.0.0.7", 1, "10.0.0.7", 5600, "10.0.0.7", ""},
		{"another port of the pod", "10.0.0.7", 1, "10.0.0.7", 22, "", "port"},
		{"the port of a rank the pod does not have", "10.0.0.7", 2, "10.0.0.7", 5602, "", "port"},
		{"rank 1's side channel", "10.0.0.7", 2, "10.0.0.7", 5601, "10.0.0.7", ""},
		{"the port below rank 0's", "10.0.0.7", 2, "10.0.0.7", 5599, "", "port"},
		{"an IPv4-mapped form of the pod's address", "10.0.0.7", 1, "::ffff:10.0.0.7", 5600, "10.0.0.7", ""},
		{"an IPv4-mapped loopback address, another port", "127.0.0.1", 1, "::ffff:127.0.0.1", 6379, "", "port"},
		{"loopback, on a pod whose address is not", "10.0.0.7", 1, "127.0.0.1", 5600, "", "host"},
		{"an IPv4-mapped loopback address, on a pod whose address is not", "10.0.0.7", 1, "::ffff:127.0.0.1", 5600, "", "host"},
		{"IPv6 loopback, on a pod whose address is not", "10.0.0.7", 1, "::1", 5600, "", "host"},
		{"localhost, on a pod whose address is not", "10.0.0.7", 1, "localhost", 5600, "", "host"},
		{"LOCALHOST., on a pod whose address is not", "10.0.0.7", 1, "LOCALHOST.", 5600, "", "host"},
		{"a name under localhost, on a pod whose address is not", "10.0.0.7", 1, "x.localhost", 5600, "", "host"},
		{"another pod", "10.0.0.7", 1, "10.0.0.8", 5600, "", "host"},
		{"a host name for the pod", "10.0.0.7", 1, "decode-0.pool.svc", 5600, "10.0.0.7", ""},
		{"a host name for the pod, another port", "10.0.0.7", 1, "decode-0.pool.svc", 22, "", "port"},
		{"the pod's loopback address (tests)", "127.0.0.1", 1, "127.0.0.1", 5600, "127.0.0.1", ""},
		{"the pod's loopback address, another port", "127.0.0.1", 1, "127.0.0.1", 22, "", "port"},
		{"another loopback address than the pod's", "127.0.0.1", 1, "127.0.0.2", 5600, "", "host"},
		{"IPv6 loopback, on a pod at 127.0.0.1", "127.0.0.1", 1, "::1", 5600, "", "host"},
		{"localhost, on a pod at 127.0.0.1", "127.0.0.1", 1, "localhost", 5600, "127.0.0.1", ""},
		{"an IPv6 pod, its address spelled otherwise", "fd00::7", 1, "fd00:0::7", 5600, "fd00::7", ""},
		{"no pod address: loopback", "", 1, "127.0.0.1", 5600, "", "no pod"},
		{"no pod address: localhost", "", 1, "localhost", 5600, "", "no pod"},
		{"no pod address: ::1", "", 1, "::1", 5600, "", "no pod"},
		{"no pod address: 127.0.0.2", "", 1, "127.0.0.2", 5600, "", "no pod"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFeature()
			f.PodAddr, f.Ranks = tc.pod, tc.ranks
			params := strings.Replace(strings.Replace(fmt.Sprintf(decodeParams, 100), `"127.0.0.1"`, `"`+tc.host+`"`, 1), ":5600", ":"+fmt.Sprint(tc.port), 1)
			ans := `{"choices":[{"index":0,"message":{"content":"x"},"finish_reason":"stop"}],"kv_transfer_params":` + params + `}`
			turn(f, "s", connectors.APIChat, chatBody(msg("user", "q")), ans)
			if tc.handedOn == "" {
				assert.Equal(t, 1.0, testutil.ToFloat64(f.M.Entries.WithLabelValues(metrics.MultiturnRefused)), "refused (%s)", tc.refusedFor)
				assert.Equal(t, 0, f.Store.Count())
				return
			}
			require.Equal(t, 1, f.Store.Count())
			pre, _ := turn(f, "s", connectors.APIChat, chatBody(msg("user", "q"), msg("assistant", "x"), msg("user", "more")), `{"choices":[]}`)
			assert.Equal(t, tc.handedOn, gjson.Get(pre, "remote_host").Str, "the next prefill leg names this pod's address: %s", pre)
			assert.EqualValues(t, tc.port, gjson.Get(pre, "remote_port").Int())
		})
	}
}

// chatAnswerFor is chatAnswer whose params name request id.
func chatAnswerFor(content, id string, tokens int) string {
	return strings.Replace(chatAnswer(content, "", tokens), `"remote_request_id":"r-1"`, `"remote_request_id":"`+id+`"`, 1)
}

// TestHistoriesFoundByContent: conversations that share one session key
// (llm-d's session-affinity token names the decode pod, the same for all
// of them), or carry none, each find their own history, turn after turn,
// in any order; a conversation whose history was taken by a replay of it
// finds none, and is recomputed.
func TestHistoriesFoundByContent(t *testing.T) {
	for _, session := range []string{"ZGVmYXVsdC9kZWNvZGUtMA==", ""} {
		t.Run(fmt.Sprintf("session %q", session), func(t *testing.T) {
			f := newFeature()
			f.Store = NewStore(StoreConfig{MaxEntries: 64, MaxBytes: 1 << 20, ClientShare: 1, TTL: time.Minute})
			const convs = 8
			hist := make([][]map[string]any, convs)
			for c := range convs {
				hist[c] = []map[string]any{msg("user", fmt.Sprint("conversation ", c))}
			}
			for turnNo := range 3 {
				for _, c := range []int{3, 0, 7, 1, 6, 2, 5, 4} {
					id := fmt.Sprintf("r-%d-%d", c, turnNo)
					content := fmt.Sprintf(" answer %d of %d", turnNo, c)
					pre, _ := turn(f, session, connectors.APIChat, chatBody(hist[c]...), chatAnswerFor(content, id, 200))
					if turnNo == 0 {
						assert.NotContains(t, pre, "remote_request_id", "a first turn has no history")
					} else {
						assert.Equal(t, fmt.Sprintf("r-%d-%d", c, turnNo-1), gjson.Get(pre, "remote_request_id").Str, "conversation %d turn %d: its own history", c, turnNo)
					}
					hist[c] = append(hist[c], msg("assistant", content), msg("user", fmt.Sprint("more ", turnNo)))
				}
			}
			assert.Equal(t, float64(2*convs), testutil.ToFloat64(f.M.Uses))
			assert.Equal(t, 0.0, testutil.ToFloat64(f.M.Misses.WithLabelValues(metrics.MultiturnPrefixMismatch)))
			pre, _ := turn(f, session, connectors.APIChat, chatBody(hist[0]...), chatAnswerFor(" x", "replay", 200))
			assert.Equal(t, "r-0-2", gjson.Get(pre, "remote_request_id").Str)
			pre, _ = turn(f, session, connectors.APIChat, chatBody(hist[0]...), chatAnswerFor(" x", "replay", 200))
			assert.NotContains(t, pre, "remote_request_id", "an entry is used once")
			assert.Equal(t, 1.0, testutil.ToFloat64(f.M.Misses.WithLabelValues(metrics.MultiturnPrefixMismatch)), "held under the narrowing, none extended")
		})
	}
}

// TestTenantsNeverShareAHistory: a turn of another tenant (cache_salt) or
// model that extends a conversation exactly gets nothing from it, and the
// conversation's own next turn still finds it.
func TestTenantsNeverShareAHistory(t *testing.T) {
	salted := func(salt string, msgs ...map[string]any) []byte {
		b, _ := json.Marshal(map[string]any{"model": "m", "messages": msgs, "cache_salt": salt})
		return b
	}
	f := newFeature()
	first := msg("user", "the same question")
	turn(f, "pod", connectors.APIChat, salted("tenant-a", first), chatAnswerFor(" same", "a-1", 200))
	noEntry := testutil.ToFloat64(f.M.Misses.WithLabelValues(metrics.MultiturnNoEntry))
	two := []map[string]any{first, msg("assistant", " same"), msg("user", "next")}
	for _, body := range [][]byte{salted("tenant-b", two...), salted("", two...), chatBody(two...)} {
		pre, _ := turn(f, "pod", connectors.APIChat, body, `{"choices":[]}`)
		assert.NotContains(t, pre, "remote_request_id", "%s: another tenant's history", body)
	}
	assert.Equal(t, noEntry+3, testutil.ToFloat64(f.M.Misses.WithLabelValues(metrics.MultiturnNoEntry)), "nothing held under their model, tenant and key")
	pre, _ := turn(f, "pod", connectors.APIChat, salted("tenant-a", two...), `{"choices":[]}`)
	assert.Equal(t, "a-1", gjson.Get(pre, "remote_request_id").Str, "the tenant's own")
}

// TestPinnedTokens: every pin a decode answer announces counts, kept or
// not, until a prefill is given it or the TTL passes.
func TestPinnedTokens(t *testing.T) {
	clock := &fakeClock{t: time.Unix(5000, 0)}
	f := newFeature()
	f.KeepReasoning = false
	f.Pins = NewPins(30*time.Second, clock.now)
	turn(f, "", connectors.APIChat, chatBody(msg("user", "kept")), chatAnswerFor(" a", "k", 300))
	clock.t = clock.t.Add(10 * time.Second)
	turn(f, "", connectors.APIChat, chatBody(msg("user", "not kept")), chatAnswer(" b", " hm", 200))
	assert.Equal(t, 1, f.Store.Count())
	assert.Equal(t, 500.0, testutil.ToFloat64(f.M.PinnedTokens), "a pin not kept still holds the engine's blocks")
	turn(f, "", connectors.APIChat, chatBody(msg("user", "kept"), msg("assistant", " a"), msg("user", "more")), `{"choices":[]}`)
	assert.Equal(t, 200.0, testutil.ToFloat64(f.M.PinnedTokens), "the prefill read the kept one")
	clock.t = clock.t.Add(31 * time.Second)
	assert.EqualValues(t, 0, f.Pins.Tokens(), "past the TTL")
}

// BenchmarkBeginLongConversation: a split turn of a 200-message chat
// looking for its history among 1,000 held under the same pod token (one
// length each of 1–200 messages held): the work is one digest per message
// and one lookup per length held below the turn's.
func BenchmarkBeginLongConversation(b *testing.B) {
	f := newFeature()
	f.Store = NewStore(StoreConfig{MaxEntries: 4096, MaxBytes: 1 << 30, ClientShare: 1, TTL: time.Hour})
	pod := ReadPromptNarrow(b, "pod")
	for i := range 1000 {
		f.Store.Put(pod, anyone, Entry{Seq: keyOf(fmt.Sprint(i)), Len: 1 + i%200, Params: []byte(`{}`), Tokens: 100})
	}
	msgs := make([]map[string]any, 200)
	for i := range msgs {
		msgs[i] = msg([]string{"user", "assistant"}[i%2], strings.Repeat("word ", 40))
	}
	body := chatBody(msgs...)
	r := feature.Request{API: connectors.APIChat, Body: body, Prefiller: "p:1", Session: "pod", Log: nopLog{}}
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		f.Begin(r, nil)
	}
}

// ReadPromptNarrow is the narrowing of a chat of model "m" under session.
func ReadPromptNarrow(b *testing.B, session string) [32]byte {
	p, ok := ReadPrompt(connectors.APIChat, chatBody(msg("user", "x")), session)
	require.True(b, ok)
	return p.Narrow()
}

// releases records the release legs asked for.
type releases struct{ legs []string }

func (r *releases) ReleasePin(prefiller string, body []byte) {
	r.legs = append(r.legs, prefiller+" "+string(body))
}

// TestPinsNoTurnWillReadAreReleased: a pin the engine announced is
// released — a one-token prefill leg to the request's prefiller carrying
// the pin as a history — when the answer is not kept, when its entry is
// evicted or replaced, and when a turn takes it under the recompute
// threshold; never for params refused, nor for a history a turn uses.
func TestPinsNoTurnWillReadAreReleased(t *testing.T) {
	good := func(id string) string {
		return `{"choices":[{"index":0,"message":{"content":"x"},"finish_reason":"stop"}],"kv_transfer_params":` +
			strings.Replace(fmt.Sprintf(decodeParams, 100), `"r-1"`, `"`+id+`"`, 1) + `}`
	}
	tests := []struct {
		name string
		run  func(f *Feature)
		want []string // remote_request_id of each release leg
	}{
		{"kept and used: none", func(f *Feature) {
			turn(f, "", connectors.APIChat, chatBody(msg("user", "q")), good("a"))
			turn(f, "", connectors.APIChat, chatBody(msg("user", "q"), msg("assistant", "x"), msg("user", "more")), `{"choices":[]}`)
		}, nil},
		{"not kept (reasoning)", func(f *Feature) {
			f.KeepReasoning = false
			turn(f, "", connectors.APIChat, chatBody(msg("user", "q")), strings.Replace(good("r"), `"content":"x"`, `"content":"x","reasoning_content":"hm"`, 1))
		}, []string{"r"}},
		{"refused: never sent anywhere", func(f *Feature) {
			turn(f, "", connectors.APIChat, chatBody(msg("user", "q")), strings.Replace(good("bad"), "127.0.0.1", "10.9.9.9", 1))
		}, nil},
		{"evicted for room", func(f *Feature) {
			f.Store = NewStore(StoreConfig{MaxEntries: 1, MaxBytes: 1 << 20, ClientShare: 1, TTL: time.Minute})
			turn(f, "", connectors.APIChat, chatBody(msg("user", "one")), good("first"))
			turn(f, "", connectors.APIChat, chatBody(msg("user", "two")), good("second"))
		}, []string{"first"}},
		{"replaced by the same sequence", func(f *Feature) {
			turn(f, "", connectors.APIChat, chatBody(msg("user", "q")), good("first"))
			turn(f, "", connectors.APIChat, chatBody(msg("user", "q")), good("again"))
		}, []string{"first"}},
		{"taken under the threshold", func(f *Feature) {
			f.Threshold = 1000
			turn(f, "", connectors.APIChat, chatBody(msg("user", "q")), good("small"))
			turn(f, "", connectors.APIChat, chatBody(msg("user", "q"), msg("assistant", "x"), msg("user", "more")), `{"choices":[]}`)
		}, []string{"small"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFeature()
			rel := &releases{}
			f.Release, f.Pins = rel, NewPins(time.Minute, nil)
			tc.run(f)
			var got []string
			for _, leg := range rel.legs {
				prefiller, body, _ := strings.Cut(leg, " ")
				assert.Equal(t, "10.0.0.1:8000", prefiller, "the request's prefiller")
				assert.Equal(t, "m", gjson.Get(body, "model").Str)
				assert.EqualValues(t, 1, gjson.Get(body, "max_tokens").Int())
				assert.Equal(t, "release", gjson.Get(body, "prompt").Str, "one word: nothing worth pulling")
				assert.True(t, gjson.Get(body, "kv_transfer_params.do_remote_decode").Bool())
				got = append(got, gjson.Get(body, "kv_transfer_params.remote_request_id").Str)
			}
			assert.Equal(t, tc.want, got)
			assert.EqualValues(t, 100*f.Store.Count(), f.Pins.Tokens(), "the pins still counted are those kept")
		})
	}
}
