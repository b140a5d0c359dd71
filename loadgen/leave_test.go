package loadgen

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestLoadLeaves(t *testing.T) {
	cases := []struct {
		name  string
		share float64
		n     int
		want  []uint64 // the request numbers that leave
	}{
		{"none", 0, 20, nil},
		{"all", 1, 4, []uint64{0, 1, 2, 3}},
		{"every tenth", 0.1, 30, []uint64{9, 19, 29}},
		{"a quarter", 0.25, 12, []uint64{3, 7, 11}},
		{"0.3: whole products not lost to binary rounding", 0.3, 10, []uint64{3, 6, 9}},
		{"fewer requests than one share", 0.1, 9, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			l := Load{LeaveShare: tc.share}
			var got []uint64
			for k := uint64(0); k < uint64(tc.n); k++ {
				if l.leaves(k) {
					got = append(got, k)
				}
			}
			assert.Equal(t, tc.want, got)
		})
	}
}

func TestLoadValidateLeave(t *testing.T) {
	base := Load{Rate: 10, Duration: time.Second, Rounds: 1}
	cases := []struct {
		name  string
		share float64
		after time.Duration
		ok    bool
	}{
		{"off", 0, 0, true},
		{"a share with a time", 0.1, 200 * time.Millisecond, true},
		{"a share without a time", 0.1, 0, false},
		{"negative share", -0.1, time.Second, false},
		{"share over 1", 1.5, time.Second, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			l := base
			l.LeaveShare, l.LeaveAfter = tc.share, tc.after
			if tc.ok {
				assert.NoError(t, l.Validate())
			} else {
				assert.Error(t, l.Validate())
			}
		})
	}
}

// holdServer answers a streamed chat completion of one token after hold;
// it counts the requests whose client left while it held them.
func holdServer(t *testing.T, hold time.Duration) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	var gone atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Reading the body to its end lets net/http watch the connection,
		// so that the request's context ends when the client closes it.
		_, _ = io.Copy(io.Discard, r.Body)
		select {
		case <-time.After(hold):
		case <-r.Context().Done():
			gone.Add(1)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\ndata: [DONE]\n\n")
	}))
	t.Cleanup(srv.Close)
	return srv, &gone
}

func TestClientLeave(t *testing.T) {
	cases := []struct {
		name       string
		hold       time.Duration
		leaveAfter time.Duration
		left       bool
	}{
		{"leaves while the server holds the answer", 2 * time.Second, 100 * time.Millisecond, true},
		{"the answer ends first: an ordinary request", 0, 2 * time.Second, false},
		{"the time already passed: it leaves before sending", 2 * time.Second, -time.Second, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv, gone := holdServer(t, tc.hold)
			c := newClient(Target{URL: srv.URL}, APIChat, 10*time.Second)
			start := time.Now()
			r := c.leave(start, []byte(`{"stream":true}`), start.Add(tc.leaveAfter))
			assert.Equal(t, tc.left, r.Left)
			assert.Empty(t, r.Err)
			if !tc.left {
				assert.Equal(t, 200, r.Status)
				assert.Equal(t, 1, r.Tokens)
				return
			}
			assert.Zero(t, r.Status, "nothing arrived before it left")
			assert.Less(t, time.Since(start), time.Second, "it did not wait for the answer")
			if tc.leaveAfter > 0 {
				require.Eventually(t, func() bool { return gone.Load() == 1 }, 2*time.Second, 10*time.Millisecond,
					"the server saw the client go")
			}
		})
	}
}

// TestRunLeaveShare: an open loop with a share of leaving clients reports
// them as left, neither ok nor errors.
func TestRunLeaveShare(t *testing.T) {
	srv, gone := holdServer(t, 300*time.Millisecond)
	reqs := []Request{{Body: []byte(`{"stream":true}`)}}
	l := Load{Rate: 40, Duration: 500 * time.Millisecond, Rounds: 1, LeaveShare: 0.5, LeaveAfter: 50 * time.Millisecond}
	res, err := Run(context.Background(), APIChat, []Target{{Name: "t", URL: srv.URL}}, reqs, l, nil)
	require.NoError(t, err)
	s := Summarize(res[0])
	require.Positive(t, s.Requests)
	assert.Equal(t, s.Requests/2, s.Left, "every second request left")
	assert.Equal(t, s.Requests-s.Left, s.OK)
	assert.Empty(t, s.Errors)
	assert.Zero(t, s.LeftAfterHead)
	assert.Eventually(t, func() bool { return gone.Load() == int64(s.Left) }, 2*time.Second, 10*time.Millisecond)
}
