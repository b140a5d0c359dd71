package main

import (
	"github.com/spf13/pflag"

	"github.com/pd-sidecar/pd-sidecar/proxy"
)

// addExposureFlags declares the flags of what the serving port passes
// through to the engine and what prefill legs carry of the client's
// headers, writing into c.
func addExposureFlags(fs *pflag.FlagSet, c *proxy.Config) {
	fs.StringVar(&c.Passthrough.Policy, "passthrough-policy", c.Passthrough.Policy,
		"which requests that are not inference requests pass through to the local engine: serving (the OpenAI/vLLM/SGLang serving API: GET /v1/models, POST /tokenize, /v1/embeddings, /v1/rerank..., GET /metrics, /version; see docs/security.md), none (only --passthrough-allow-paths), all (every method and path, as llm-d); the rest is refused, 405 for a method, 403 for a path")
	fs.StringSliceVar(&c.Passthrough.AllowPaths, "passthrough-allow-paths", c.Passthrough.AllowPaths,
		"more paths passed through with GET, HEAD or POST: exact (/sleep) or a prefix ending in /* (/v1/lora/*); matched on the decoded, normalised path without its query")
	fs.StringSliceVar(&c.Passthrough.AllowMethods, "passthrough-allow-methods", c.Passthrough.AllowMethods,
		"more methods passed through on every path that passes (e.g. OPTIONS for CORS preflights); CONNECT only with --passthrough-policy all")
	fs.StringSliceVar(&c.PrefillStripHeaders, "prefill-strip-headers", c.PrefillStripHeaders,
		"client headers removed from every leg sent to a prefiller, e.g. Authorization,Cookie,X-Api-Key (empty: forwarded, as llm-d does; the local engine's legs always keep them)")
}
