package harness

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// fatalRecorder is a testing.TB whose Fatalf records the failure and ends
// the calling goroutine, as the real one does.
type fatalRecorder struct {
	testing.TB
	failed string
}

func (f *fatalRecorder) Fatalf(format string, args ...any) {
	f.failed = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func (f *fatalRecorder) Helper() {}

// TestStartOnFreePortsTriesAgainOnlyWhenAPortWasTaken: a process that
// exits because its port was taken between FreePort and its bind is started
// again (up to startAttempts times, and only when the harness chose its
// ports); any other early exit fails the test at once.
func TestStartOnFreePortsTriesAgainOnlyWhenAPortWasTaken(t *testing.T) {
	healthy := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	defer healthy.Close()
	lost := "echo 'listen tcp 127.0.0.1:1: bind: address already in use'; exit 1"
	crashed := "echo 'panic: something else'; exit 2"
	tests := []struct {
		name     string
		retry    bool
		runs     []string // the shell script of each try; the last one is repeated
		wantRuns int
		wantFail bool
	}{
		{"port lost once, then served", true, []string{lost, "exec sleep 30"}, 2, false},
		{"port lost on every try", true, []string{lost}, startAttempts, true},
		{"port lost, but it was the test's own", false, []string{lost, "exec sleep 30"}, 1, true},
		{"exit for another reason", true, []string{crashed, "exec sleep 30"}, 1, true},
		{"served at once", true, []string{"exec sleep 30"}, 1, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rec := &fatalRecorder{TB: t}
			runs := 0
			done := make(chan struct{})
			go func() {
				defer close(done)
				startOnFreePorts(rec, tc.retry, func() (*Proc, string) {
					script := tc.runs[min(runs, len(tc.runs)-1)]
					runs++
					p := Start(t, "/bin/sh", "-c", script)
					if script != "exec sleep 30" {
						_, _ = p.Wait(10 * time.Second)
					}
					return p, healthy.URL
				})
			}()
			<-done
			assert.Equal(t, tc.wantRuns, runs, "tries")
			assert.Equal(t, tc.wantFail, rec.failed != "", "failed: %s", rec.failed)
		})
	}
}
