//go:build ucx

package ucx

import (
	"slices"
	"strings"
)

// localTLS is the UCX_TLS of the pullers' shared-memory worker, whose
// endpoints have no peer failure detection: the shared-memory transports
// that only copy through mapped segments (sysv, posix) among those tls
// allows; "" when it allows neither.
//
// Why a worker of its own: UCX's shared-memory transports refuse an
// endpoint that asks for peer failure detection, so on a worker with every
// transport the gets to an agent on this host would ride tcp. And why not
// cma (or knem, xpmem) on it: UCX 1.19 reads through cma, and a read from a
// process that has died is a fatal error (the whole puller aborts) unless
// the endpoint asked for peer failure handling. sysv and posix only touch
// segments that stay mapped; a dead agent there shows as gets that never
// complete, which the control connection notices.
func localTLS(tls string) string {
	tls = strings.TrimSpace(tls)
	mm := []string{"posix", "sysv"}
	aliases := []string{"all", "sm", "shm", "mm"}
	var out []string
	if rest, ok := strings.CutPrefix(tls, "^"); ok { // every transport but these
		out = mm
		for name := range strings.SplitSeq(rest, ",") {
			name = strings.TrimSpace(name)
			if slices.Contains(aliases, name) {
				return ""
			}
			out = slices.DeleteFunc(slices.Clone(out), func(s string) bool { return s == name })
		}
		return strings.Join(out, ",")
	}
	for name := range strings.SplitSeq(tls, ",") {
		switch name = strings.TrimSpace(name); {
		case slices.Contains(aliases, name):
			out = append(out, mm...)
		case slices.Contains(mm, name):
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return strings.Join(slices.Compact(out), ",")
}
