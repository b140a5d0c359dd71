package multiturnbench

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func TestStreamAcc(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	type ev struct {
		line string
		ms   int
	}
	for _, tc := range []struct {
		name                 string
		events               []ev
		content              string
		ttft                 time.Duration
		tokens, prompt, comp int
		err                  string
	}{{
		name: "role chunk, content, usage",
		events: []ev{
			{`data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}`, 5},
			{`data: {"choices":[{"index":0,"delta":{"content":" kalo"}}]}`, 40},
			{"", 41},
			{`data: {"choices":[{"index":0,"delta":{"content":" mine"},"finish_reason":"length"}],"kv_transfer_params":{"x":1}}`, 45},
			{`data: {"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":2}}`, 46},
			{`data: [DONE]`, 47},
		},
		content: " kalo mine", ttft: 40 * time.Millisecond, tokens: 2, prompt: 12, comp: 2,
	}, {
		name: "reasoning first: TTFT at the first reasoning token, content alone carried back",
		events: []ev{
			{`data: {"choices":[{"delta":{"reasoning_content":" hmm"}}]}`, 10},
			{`data: {"choices":[{"delta":{"content":" yes"}}]}` + "\r\n", 20},
			{"data:[DONE]", 30},
		},
		content: " yes", ttft: 10 * time.Millisecond, tokens: 2,
	}, {
		name: "comments and event lines are skipped",
		events: []ev{
			{": keep-alive", 1},
			{"event: message", 2},
			{`data: {"choices":[{"delta":{"content":"x"}}]}`, 3},
			{"data: [DONE]", 4},
		},
		content: "x", ttft: 3 * time.Millisecond, tokens: 1,
	}, {
		name:   "error event",
		events: []ev{{`data: {"error":{"message":"boom","code":500}}`, 1}},
		err:    "error event",
	}, {
		name:   "no [DONE]",
		events: []ev{{`data: {"choices":[{"delta":{"content":"x"}}]}`, 1}},
		err:    "without [DONE]",
	}, {
		name:   "no token",
		events: []ev{{"data: [DONE]", 1}},
		err:    "no token",
	}, {
		name:   "bad event",
		events: []ev{{"data: {nope", 1}},
		err:    "bad event",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			a := &streamAcc{start: t0}
			var err error
			for _, e := range tc.events {
				if err = a.line([]byte(e.line+"\n"), at(e.ms)); err != nil {
					break
				}
			}
			var res turnResult
			if err == nil {
				res, err = a.result(at(100))
			}
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want one with %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if res.Content != tc.content || res.TTFT != tc.ttft || res.Tokens != tc.tokens ||
				res.PromptTokens != tc.prompt || res.CompletionTokens != tc.comp || res.Latency != 100*time.Millisecond {
				t.Errorf("got %+v, want content %q ttft %v tokens %d usage %d/%d latency 100ms", res, tc.content, tc.ttft, tc.tokens, tc.prompt, tc.comp)
			}
		})
	}
}

// send posts the turn with the client's and the turn's headers and reads
// the stream.
func TestChatClientSend(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body struct {
			Messages  []Message `json:"messages"`
			MaxTokens int       `json:"max_tokens"`
			Stream    bool      `json:"stream"`
		}
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil || r.URL.Path != "/v1/chat/completions" || !body.Stream {
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		if r.Header.Get("x-session-token") != "conv-1" || r.Header.Get("x-prefiller-host-port") != "127.0.0.1:9" {
			http.Error(w, "missing headers", http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		for i := range body.MaxTokens {
			fmt.Fprintf(w, "data: {\"choices\":[{\"delta\":{\"content\":\" w%d\"}}]}\n\n", i)
		}
		fmt.Fprintf(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d}}\n\ndata: [DONE]\n\n",
			PromptTokens(body.Messages), body.MaxTokens)
	}))
	defer srv.Close()
	c := newChatClient(srv.URL, 5*time.Second, map[string]string{"x-prefiller-host-port": "127.0.0.1:9"})
	defer c.close()
	msgs := []Message{{Role: "user", Content: "one two three"}}
	body, err := chatBody(model, msgs, 3)
	if err != nil {
		t.Fatal(err)
	}
	res, err := c.send(context.Background(), body, map[string]string{"x-session-token": "conv-1"})
	if err != nil {
		t.Fatal(err)
	}
	if res.Content != " w0 w1 w2" || res.Tokens != 3 || res.PromptTokens != PromptTokens(msgs) || res.TTFT <= 0 {
		t.Errorf("got %+v", res)
	}
	if _, err := c.send(context.Background(), body, nil); err == nil || !strings.Contains(err.Error(), "status 400") {
		t.Errorf("a refused turn gave %v, want status 400", err)
	}
}

func TestParseHelpFlags(t *testing.T) {
	help := `Usage of engine-sim:
      --role string                          prefill, decode (default "both")
  -p, --port int                             HTTP port (see --kv-port)
      --bidirectional-kv-xfer[=true|false]   pins a sequence; every role then listens on --kv-port)
      --decoder-kv-blocks-ttl duration       how long (default 8m0s)
`
	got := parseHelpFlags(help)
	for _, want := range []string{"role", "port", "bidirectional-kv-xfer", "decoder-kv-blocks-ttl"} {
		if !got[want] {
			t.Errorf("flag %q not found in %v", want, got)
		}
	}
	if got["kv-port"] || len(got) != 4 {
		t.Errorf("got %v: a flag a usage text mentions is not one the binary defines", got)
	}
}
