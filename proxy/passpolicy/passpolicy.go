// Package passpolicy decides which requests pass through the serving port
// to the local engine. Everything that is neither an inference request the
// sidecar serves nor one of its own endpoints used to be forwarded to the
// engine whatever its method and path: TRACE, CONNECT, OPTIONS * and the
// engine's admin endpoints (vLLM's /sleep, /collective_rpc,
// /reset_prefix_cache, /start_profile..., which its --api-key does not
// guard: only /v1 paths are checked) reached it from whoever reached the
// pod. The passthrough policy admits the serving API and refuses the rest,
// before anything is forwarded. The decision is a pure function of the
// method and the path (fasthttp's normalised path, without the query), made
// in one place, the proxy's request handler: the lane serves only POSTs to
// the inference paths, which every policy admits, and hands every other
// request to fasthttp.
package passpolicy

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/valyala/fasthttp"

	"github.com/pd-sidecar/pd-sidecar/connectors"
)

// Passthrough policies (--passthrough-policy).
const (
	// Serving passes the engines' serving API (servingRoutes) and the paths
	// of --passthrough-allow-paths.
	Serving = "serving"
	// None passes only the paths of --passthrough-allow-paths.
	None = "none"
	// All passes every method and path, as llm-d's sidecar does.
	All = "all"
)

// Errors of refused passthrough requests; the answer says these words, never
// the request's path.
var (
	// ErrMethod: the method is not passed through on this path (405).
	ErrMethod = errors.New("method not allowed through the sidecar (--passthrough-policy, --passthrough-allow-methods)")
	// ErrPath: the path is not passed through (403).
	ErrPath = errors.New("path not allowed through the sidecar (--passthrough-policy, --passthrough-allow-paths)")
)

// Config says which requests pass through to the local engine.
type Config struct {
	// Policy is Serving (default), None or All.
	Policy string
	// AllowPaths are more path patterns passed through, with GET, HEAD or
	// POST (and AllowMethods): an exact path ("/sleep"), or a prefix ending
	// in "/*" ("/v1/lora/*" passes "/v1/lora/a" and "/v1/lora/a/b").
	AllowPaths []string
	// AllowMethods are methods passed through on every path that passes
	// (OPTIONS for CORS preflights, say). CONNECT never is: its target is
	// not a path (only All passes it).
	AllowMethods []string
}

// DefaultConfig is the serving policy.
func DefaultConfig() Config {
	return Config{Policy: Serving}
}

// Validate reports the first invalid setting, as one line.
func (c Config) Validate() error {
	_, err := New(c)
	return err
}

// route is a path pattern and the methods it passes.
type route struct {
	pattern string
	methods []string
}

// Methods a route lists.
const (
	get, head, post = fasthttp.MethodGet, fasthttp.MethodHead, fasthttp.MethodPost
)

var (
	getOnly  = []string{get}
	postOnly = []string{post}
	getPost  = []string{get, post}
)

// inferenceRoutes are the paths the sidecar serves itself (POST); any other
// method on them is a 405 under every policy but All.
func inferenceRoutes() []route {
	var rs []route
	for api := connectors.APICompletions; api <= connectors.APIGenerate; api++ {
		rs = append(rs, route{api.String(), postOnly})
	}
	return rs
}

// servingRoutes are the engines' serving API beyond the inference paths:
// what a client of an OpenAI-compatible server, a gateway or a load
// balancer calls. Nothing here changes the engine's state or configuration,
// reveals its configuration, or runs code of the caller's choosing. vLLM's
// routes as its api_server and serve/ routers declare them; SGLang's native
// ones for --kv-connector sglang.
var servingRoutes = []route{
	// The OpenAI API.
	{"/v1/models", getOnly},                   // the served models: how clients and gateways find the model name
	{"/v1/responses/*", getPost},              // a stored response, its input items, its cancel (Responses API)
	{"/v1/messages/count_tokens", postOnly},   // Anthropic Messages API token count
	{"/v1/embeddings", postOnly},              // embeddings (pooling models)
	{"/v1/audio/transcriptions", postOnly},    // speech to text
	{"/v1/audio/translations", postOnly},      // speech to English text
	{"/v1/chat/completions/render", postOnly}, // the prompt a chat request renders to, no generation
	{"/v1/completions/render", postOnly},      // likewise for a completion
	// vLLM's own serving API.
	{"/tokenize", postOnly},   // text to token ids, as the engine's tokenizer does
	{"/detokenize", postOnly}, // token ids to text
	{"/pooling", postOnly},    // pooling models' raw output
	{"/classify", postOnly},   // classification models
	{"/score", postOnly},      // cross-encoder scores
	{"/v1/score", postOnly},
	{"/rerank", postOnly}, // reranking (Jina and Cohere shapes)
	{"/v1/rerank", postOnly},
	{"/v2/rerank", postOnly},
	{"/invocations", postOnly}, // SageMaker's inference entry (chat, completions, embeddings by body)
	{"/ping", getPost},         // SageMaker's health check
	{"/load", getOnly},         // in-flight request count, for load balancers (--enable-server-load-tracking)
	{"/version", getOnly},      // the engine's version
	{"/metrics", getOnly},      // the engine's Prometheus metrics; the sidecar's own /metrics wins unless --metrics-port moves it
	// SGLang's native serving API.
	{"/generate", postOnly},       // native generation (text or token ids)
	{"/encode", postOnly},         // native embeddings
	{"/health_generate", getOnly}, // a health check that runs one generation
	{"/get_model_info", getOnly},  // the served model's path and kind
}

// Policy is a Config made ready for Decide.
type Policy struct {
	all      bool
	exact    map[string][]string // path: the methods it passes
	prefixes []route             // pattern without its "*"
	extra    []string            // AllowMethods
	methods  []string            // GET, HEAD, POST and extra: the methods a path may pass
}

// New checks c and prepares its decisions.
func New(c Config) (*Policy, error) {
	pp := &Policy{exact: map[string][]string{}}
	var routes []route
	switch c.Policy {
	case All:
		switch {
		case len(c.AllowPaths) > 0:
			return nil, errors.New("--passthrough-allow-paths has no effect with --passthrough-policy all (every path passes)")
		case len(c.AllowMethods) > 0:
			return nil, errors.New("--passthrough-allow-methods has no effect with --passthrough-policy all (every method passes)")
		}
		pp.all = true
		return pp, nil
	case Serving:
		routes = append(inferenceRoutes(), servingRoutes...)
	case None:
		routes = inferenceRoutes()
	default:
		return nil, fmt.Errorf("--passthrough-policy must be %s, %s or %s, got %q", Serving, None, All, c.Policy)
	}
	for _, m := range c.AllowMethods {
		switch {
		case !IsToken(m):
			return nil, fmt.Errorf("--passthrough-allow-methods %q is not an HTTP method", m)
		case m == fasthttp.MethodConnect:
			return nil, errors.New("--passthrough-allow-methods CONNECT: a CONNECT names a host, not a path, so no path rule can admit it (only --passthrough-policy all passes it)")
		}
		pp.extra = addMethod(pp.extra, m)
	}
	for _, p := range c.AllowPaths {
		if err := validPattern(p); err != nil {
			return nil, fmt.Errorf("--passthrough-allow-paths %q: %w", p, err)
		}
		routes = append(routes, route{p, []string{get, post}})
	}
	for _, r := range routes {
		ms := slices.Clone(r.methods)
		if slices.Contains(ms, get) {
			ms = addMethod(ms, head) // HEAD is GET without the body
		}
		for _, m := range pp.extra {
			ms = addMethod(ms, m)
		}
		if p, ok := strings.CutSuffix(r.pattern, "*"); ok {
			pp.prefixes = append(pp.prefixes, route{p, ms})
		} else {
			for _, m := range ms {
				pp.exact[r.pattern] = addMethod(pp.exact[r.pattern], m)
			}
		}
	}
	pp.methods = append([]string{get, head, post}, pp.extra...)
	return pp, nil
}

// Verdict is what Decide says of a request.
type Verdict struct {
	// Status is 0 (passed through), 405 or 403.
	Status int
	// Allow is a 405's Allow header: the methods the path passes, comma
	// separated; empty when the path passes none.
	Allow string
	// Err says why, in fixed words: ErrMethod or ErrPath.
	Err error
}

// Pass reports whether the request passes through.
func (v Verdict) Pass() bool { return v.Status == 0 }

// Decide judges a request of method to path (normalised, without query)
// that is neither an inference request the sidecar serves nor one of its
// own endpoints. A method other than GET, HEAD, POST and AllowMethods is
// refused 405 whatever the path (TRACE, CONNECT, OPTIONS * by default); a
// path that passes, with a method it does not pass, 405 too; any other path
// 403.
func (pp *Policy) Decide(method, path string) Verdict {
	if pp.all {
		return Verdict{}
	}
	ms, known := pp.exact[path]
	for _, r := range pp.prefixes {
		if strings.HasPrefix(path, r.pattern) {
			known = true
			for _, m := range r.methods {
				ms = addMethod(slices.Clip(ms), m)
			}
		}
	}
	switch {
	case slices.Contains(ms, method):
		return Verdict{}
	case known || !slices.Contains(pp.methods, method):
		return Verdict{Status: fasthttp.StatusMethodNotAllowed, Allow: strings.Join(ms, ", "), Err: ErrMethod}
	}
	return Verdict{Status: fasthttp.StatusForbidden, Err: ErrPath}
}

// Own judges a request of method to one of the sidecar's own endpoints
// (/health, /ready, /metrics, /debug/pd), which answer GET and HEAD; with
// All any method, as before the policy existed.
func (pp *Policy) Own(method string) Verdict {
	if pp.all || method == get || method == head {
		return Verdict{}
	}
	return Verdict{Status: fasthttp.StatusMethodNotAllowed, Allow: get + ", " + head, Err: ErrMethod}
}

// addMethod adds m to ms once, keeping ms in the order methods came.
func addMethod(ms []string, m string) []string {
	if slices.Contains(ms, m) {
		return ms
	}
	return append(ms, m)
}

// validPattern checks a --passthrough-allow-paths pattern: an absolute path
// of visible ASCII, no query or fragment, and a "*" only as its last
// segment ("/prefix/*").
func validPattern(p string) error {
	switch {
	case !strings.HasPrefix(p, "/"):
		return errors.New("a path pattern begins with /")
	case strings.ContainsAny(p, "?#"):
		return errors.New("a path pattern has no query or fragment (the query is not matched)")
	case strings.Contains(strings.TrimSuffix(p, "/*"), "*"):
		return errors.New(`"*" only ends a pattern, after a "/" ("/prefix/*")`)
	}
	for i := 0; i < len(p); i++ {
		if p[i] <= ' ' || p[i] >= 0x7f {
			return errors.New("a path pattern is visible ASCII (paths are matched decoded: write %2F as /)")
		}
	}
	return nil
}

// IsToken reports whether s is an HTTP token (RFC 9110 5.6.2), as a method
// and a header name are.
func IsToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c >= 0x7f || strings.IndexByte(`"(),/:;<=>?@[\]{}`, c) >= 0 {
			return false
		}
	}
	return true
}
