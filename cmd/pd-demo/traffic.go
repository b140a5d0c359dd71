package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"time"
)

// demo holds the addresses and the answers of the local class, which every
// other class is compared with.
type demo struct {
	sidecar, prefill, decode string
	maxTokens                int
	local                    map[int]string
}

type trafficClass struct {
	name   string
	header string
	stream bool
}

type classResult struct {
	ok, failed, same, compared int
	latencies                  []time.Duration
	errs                       []string
}

func (d *demo) prompt(i int) string {
	return fmt.Sprintf("Request %d of the pd-sidecar demo: summarise the history of prefill and decode "+
		"disaggregation for large language model serving, with attention to KV cache transfer, in plain words.", i)
}

func (d *demo) runClass(ctx context.Context, c trafficClass, n int) classResult {
	var r classResult
	for i := 0; i < n; i++ {
		start := time.Now()
		text, err := d.chat(ctx, d.prompt(i), c)
		if err != nil {
			r.failed++
			if len(r.errs) < 3 {
				r.errs = append(r.errs, err.Error())
			}
			continue
		}
		r.ok++
		r.latencies = append(r.latencies, time.Since(start))
		if c.header == "" && d.local == nil {
			d.local = map[int]string{}
		}
		if c.header == "" {
			d.local[i] = text
			continue
		}
		if want, ok := d.local[i]; ok {
			r.compared++
			if want == text {
				r.same++
			}
		}
	}
	return r
}

// chat sends one chat completion through the sidecar and returns the text.
func (d *demo) chat(ctx context.Context, prompt string, c trafficClass) (string, error) {
	body, _ := json.Marshal(map[string]any{
		"model":      demoModel,
		"messages":   []any{map[string]any{"role": "user", "content": prompt}},
		"max_tokens": d.maxTokens,
		"stream":     c.stream,
	})
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, d.sidecar+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", "application/json")
	if c.header != "" {
		req.Header.Set("x-prefiller-host-port", c.header)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return "", fmt.Errorf("HTTP %d: %s", resp.StatusCode, strings.TrimSpace(string(b)))
	}
	if !c.stream {
		var ans struct {
			Choices []struct {
				Message struct {
					Content string `json:"content"`
				} `json:"message"`
			} `json:"choices"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&ans); err != nil {
			return "", fmt.Errorf("decode answer: %w", err)
		}
		if len(ans.Choices) == 0 {
			return "", errors.New("answer without choices")
		}
		return ans.Choices[0].Message.Content, nil
	}
	var text strings.Builder
	sc := bufio.NewScanner(resp.Body)
	done := false
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if data == "[DONE]" {
			done = true
			break
		}
		var ev struct {
			Error   json.RawMessage `json:"error"`
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(data), &ev); err != nil {
			return "", fmt.Errorf("bad event: %w", err)
		}
		if len(ev.Error) > 0 {
			return "", fmt.Errorf("error event: %s", ev.Error)
		}
		if len(ev.Choices) > 0 {
			text.WriteString(ev.Choices[0].Delta.Content)
		}
	}
	if err := sc.Err(); err != nil {
		return "", err
	}
	if !done {
		return "", errors.New("stream ended without [DONE]")
	}
	return text.String(), nil
}

func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := append([]time.Duration{}, ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[int(p*float64(len(s)-1))]
}
