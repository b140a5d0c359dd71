package main

import (
	"net"
	"strconv"
	"strings"

	"github.com/pd-sidecar/pd-sidecar/proxy"
	"github.com/pd-sidecar/pd-sidecar/ssrf"
)

// watchPrefillers tells p of every prefiller the InferencePool watch
// admits, now and as pods become Ready, so that --prefill-prewarm warms
// them before a request names them. One llm-d pool holds both prefill and
// decode pods: only those labelled llm-d.ai/role=prefill, or carrying no
// role label, are prefillers to warm.
func watchPrefillers(w *ssrf.PoolWatcher, p *proxy.Proxy) {
	w.OnAdded(func(ms []ssrf.Member) {
		for _, m := range ms {
			if prewarmRole(m.Role) {
				p.NotePrefiller(m.Addr)
			}
		}
	})
}

// prewarmRole reports whether a pool pod of role (its llm-d.ai/role
// label, "" when none) is a prefiller to warm.
func prewarmRole(role string) bool { return role == "" || role == "prefill" }

// staticPrefillers are the entries of --prefiller-allowlist that name one
// prefiller (host:port, no wildcard, no CIDR): warmed at start with
// --prefill-prewarm, as the pool's pods are when the watch admits them.
func staticPrefillers(entries []string) []string {
	var out []string
	for _, e := range entries {
		host, port, err := net.SplitHostPort(e)
		if err != nil || host == "" || port == "*" || strings.ContainsAny(host, "*/") {
			continue
		}
		if _, err := strconv.ParseUint(port, 10, 16); err != nil {
			continue
		}
		out = append(out, e)
	}
	return out
}
