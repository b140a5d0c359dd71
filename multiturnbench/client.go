package multiturnbench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// turnResult is what one streamed turn saw.
type turnResult struct {
	// TTFT is from the request's start to the first content or reasoning
	// token; Latency to the stream's end.
	TTFT, Latency time.Duration
	// Content is the answer's content, the stream's deltas concatenated.
	Content string
	// Tokens counts the content and reasoning deltas.
	Tokens int
	// PromptTokens and CompletionTokens are the usage the stream reported
	// (0 when it reported none).
	PromptTokens, CompletionTokens int
}

// streamAcc accumulates one chat stream's events.
type streamAcc struct {
	start   time.Time
	content strings.Builder
	res     turnResult
	done    bool
}

// chatEvent is the part of a chat completion chunk the bench reads.
type chatEvent struct {
	Error   json.RawMessage `json:"error"`
	Choices []struct {
		Delta struct {
			Content          string `json:"content"`
			ReasoningContent string `json:"reasoning_content"`
			Reasoning        string `json:"reasoning"`
		} `json:"delta"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
	} `json:"usage"`
}

// line takes one line of the SSE stream, read at now. Only data lines
// count; "[DONE]" ends the stream and an error event fails it.
func (a *streamAcc) line(raw []byte, now time.Time) error {
	data, ok := bytes.CutPrefix(bytes.TrimRight(raw, "\r\n"), []byte("data:"))
	if !ok {
		return nil
	}
	data = bytes.TrimSpace(data)
	if bytes.Equal(data, []byte("[DONE]")) {
		a.done = true
		return nil
	}
	var ev chatEvent
	if err := json.Unmarshal(data, &ev); err != nil {
		return fmt.Errorf("bad event %.200q: %w", data, err)
	}
	if len(ev.Error) > 0 && !bytes.Equal(ev.Error, []byte("null")) {
		return fmt.Errorf("error event: %.300s", ev.Error)
	}
	for _, c := range ev.Choices {
		d := c.Delta
		if d.Content == "" && d.ReasoningContent == "" && d.Reasoning == "" {
			continue
		}
		if a.res.Tokens == 0 {
			a.res.TTFT = now.Sub(a.start)
		}
		a.res.Tokens++
		a.content.WriteString(d.Content)
	}
	if ev.Usage != nil {
		a.res.PromptTokens, a.res.CompletionTokens = ev.Usage.PromptTokens, ev.Usage.CompletionTokens
	}
	return nil
}

// result is the turn's result once the stream ended at end.
func (a *streamAcc) result(end time.Time) (turnResult, error) {
	if !a.done {
		return turnResult{}, errors.New("stream ended without [DONE]")
	}
	if a.res.Tokens == 0 {
		return turnResult{}, errors.New("stream had no token")
	}
	r := a.res
	r.Content = a.content.String()
	r.Latency = end.Sub(a.start)
	return r, nil
}

// chatClient streams chat completions through the sidecar.
type chatClient struct {
	hc      *http.Client
	url     string
	timeout time.Duration
	// headers are sent with every request (the prefiller's host:port).
	headers map[string]string
}

func newChatClient(baseURL string, timeout time.Duration, headers map[string]string) *chatClient {
	tr := &http.Transport{
		Proxy:               nil, // loopback only: never through an environment proxy
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     30 * time.Second,
		DisableCompression:  true,
	}
	return &chatClient{hc: &http.Client{Transport: tr}, url: baseURL + "/v1/chat/completions", timeout: timeout, headers: headers}
}

func (c *chatClient) close() { c.hc.CloseIdleConnections() }

// chatBody is one turn's request body.
func chatBody(model string, msgs []Message, maxTokens int) ([]byte, error) {
	return json.Marshal(map[string]any{
		"model": model, "messages": msgs, "max_tokens": maxTokens,
		"stream": true, "stream_options": map[string]any{"include_usage": true},
	})
}

// send streams one turn with extra headers (the session key) and returns
// what it saw; the timeout bounds the whole turn.
func (c *chatClient) send(ctx context.Context, body []byte, extra map[string]string) (turnResult, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url, bytes.NewReader(body))
	if err != nil {
		return turnResult{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range c.headers {
		req.Header.Set(k, v)
	}
	for k, v := range extra {
		req.Header.Set(k, v)
	}
	acc := &streamAcc{start: time.Now()}
	resp, err := c.hc.Do(req)
	if err != nil {
		return turnResult{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return turnResult{}, fmt.Errorf("status %d: %s", resp.StatusCode, bytes.TrimSpace(b))
	}
	br := bufio.NewReaderSize(resp.Body, 64<<10)
	for !acc.done {
		line, err := br.ReadBytes('\n')
		if len(line) > 0 {
			if err := acc.line(line, time.Now()); err != nil {
				return turnResult{}, err
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			return turnResult{}, fmt.Errorf("stream cut: %w", err)
		}
	}
	// Drain the stream's end so that the connection is kept.
	_, _ = io.Copy(io.Discard, io.LimitReader(br, 64<<10))
	return acc.result(time.Now())
}
