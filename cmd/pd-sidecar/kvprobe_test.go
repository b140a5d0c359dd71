package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The lane texts are ucp_ep_print_info's, captured from the ucx transport's
// endpoints on loopback (TestLanesFollowUCXTLS -v) with each UCX version.
func TestLaneSummaryAndVerdict(t *testing.T) {
	for _, tc := range []struct {
		file, version string
		summary       string
		verdict       []string
	}{
		{"1.13-sm.txt", "1.13.1", "sysv/memory (am get); posix/memory (get)",
			[]string{"ucx over sysv/posix shared memory", "maps only memory it allocated itself", "UCX 1.13.1"}},
		{"1.13-tcp.txt", "1.13.1", "tcp/lo (am keepalive wireup); tcp cannot read remote memory: gets are emulated in software over the am lane",
			[]string{"ucx over tcp", "RMA is emulated in software"}},
		{"1.19-sm.txt", "1.19.0", "sysv/memory (am); posix/memory; cma/memory (rma_bw#0)",
			[]string{"ucx over shared memory", "in one copy (cma or xpmem)"}},
	} {
		t.Run(tc.file, func(t *testing.T) {
			text, err := os.ReadFile(filepath.Join("testdata", "ucx-lanes", tc.file))
			require.NoError(t, err)
			sum := summarizeLanes(string(text))
			assert.Equal(t, tc.summary, sum)
			v := verdict(probeReport{Transport: "ucx", UCXVersion: tc.version, LaneSummary: sum,
				Blocks: []blockResult{{BlockBytes: 1 << 20, GBps: 1.5}}})
			assert.Contains(t, v, "1.50 GB/s at 1MiB blocks")
			for _, want := range tc.verdict {
				assert.Contains(t, v, want)
			}
		})
	}
}
