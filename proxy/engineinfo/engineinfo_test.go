package engineinfo_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd-sidecar/pd-sidecar/proxy/engineinfo"
)

func TestParse(t *testing.T) {
	v := engineinfo.Probes()[0]
	for _, tc := range []struct {
		name   string
		status int
		body   string
		want   string // "" = none
	}{
		{"vllm", 200, `{"version":"0.11.2"}`, "0.11.2"},
		{"dev build", 200, `{"version":"0.12.0rc2.dev41+g0050936b"}`, "0.12.0rc2.dev41+g0050936b"},
		{"not found", 404, `{"version":"1"}`, ""},
		{"not JSON", 200, `<html>`, ""},
		{"a number", 200, `{"version":11}`, ""},
		{"empty", 200, `{"version":""}`, ""},
		{"too long", 200, `{"version":"` + strings.Repeat("1", 65) + `"}`, ""},
		{"a control character", 200, `{"version":"1\n2"}`, ""},
		{"non-ASCII", 200, `{"version":"1é"}`, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			info, ok := engineinfo.Parse(v, tc.status, []byte(tc.body))
			assert.Equal(t, tc.want != "", ok)
			if ok {
				assert.Equal(t, engineinfo.Info{Engine: "vllm", Version: tc.want}, info)
			}
		})
	}
}

// TestWatcherReportsChanges: SGLang is found by its own path; an engine
// not up yet is asked again; a changed version is reported once.
func TestWatcherReportsChanges(t *testing.T) {
	var mu sync.Mutex
	up, version := false, "0.5.1"
	get := func(_ context.Context, path string) (int, []byte, error) {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case !up:
			return 0, nil, errors.New("refused")
		case path == "/get_server_info":
			return 200, []byte(`{"model_path":"m","version":"` + version + `"}`), nil
		}
		return 404, []byte(`{"detail":"Not Found"}`), nil
	}
	changes := make(chan [2]engineinfo.Info, 4)
	w := engineinfo.New(get, 10*time.Millisecond, func(old, now engineinfo.Info) { changes <- [2]engineinfo.Info{old, now} })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { w.Run(ctx); close(done) }()
	mu.Lock()
	up = true
	mu.Unlock()
	got := <-changes
	assert.Equal(t, [2]engineinfo.Info{{}, {Engine: "sglang", Version: "0.5.1"}}, got)
	mu.Lock()
	version = "0.5.2"
	mu.Unlock()
	got = <-changes
	assert.Equal(t, "0.5.2", got[1].Version)
	assert.Equal(t, "0.5.1", got[0].Version)
	cancel()
	<-done
	require.Empty(t, changes, "no change, no report")
	assert.Equal(t, engineinfo.Info{Engine: "sglang", Version: "0.5.2"}, w.Current())
}
