package e2e

import (
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/pd-sidecar/pd-sidecar/e2e/harness"
)

// closeWriteAcked half-closes c and returns once the peer's kernel has
// acknowledged the FIN (c is in FIN_WAIT2 or later, read from TCP_INFO): from
// then on the sidecar's socket reads as closed, however loaded the machine
// is and however late loopback delivers the FIN.
func closeWriteAcked(t *testing.T, c *net.TCPConn) {
	t.Helper()
	require.NoError(t, c.CloseWrite())
	rc, err := c.SyscallConn()
	require.NoError(t, err)
	harness.Eventually(t, 30*time.Second, "the FIN is acknowledged", func() bool {
		var state uint8
		require.NoError(t, rc.Control(func(fd uintptr) {
			info, err := unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
			require.NoError(t, err)
			state = info.State
		}))
		return state != unix.BPF_TCP_ESTABLISHED && state != unix.BPF_TCP_FIN_WAIT1
	})
}
