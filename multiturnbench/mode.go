package multiturnbench

import (
	"encoding/base64"
	"fmt"
	"strings"
	"time"
)

// The session-token modes: how a with mode's conversations name
// themselves to the sidecar (Options.SessionHeader).
const (
	// TokenConversation: one key per conversation.
	TokenConversation = "conversation"
	// TokenPod: every conversation carries the same key, the one llm-d's
	// endpoint picker sets for session affinity to the decode pod.
	TokenPod = "pod"
	// TokenNone: no session header at all.
	TokenNone = "none"
)

// ModeWithout is the baseline: no bidirectional KV transfer anywhere.
const ModeWithout = "without"

// withPrefix starts a with mode's name: with-<token mode>[@<TTL>].
const withPrefix = "with-"

// mode is one configuration a run measures.
type mode struct {
	// name is as given in Options.Modes, normalized (ModeWithout or
	// with-<token>[@<ttl>]).
	name string
	// token is the session-token mode; "" for ModeWithout.
	token string
	// ttl is the decode engine's decoder_kv_blocks_ttl (0 for
	// ModeWithout); the sidecar's cache TTL follows it unless
	// Options.CacheTTL is set.
	ttl time.Duration
}

func (m mode) with() bool { return m.token != "" }

// parseMode reads a mode name: "without", or "with-<token>" with token
// conversation, pod or none, optionally "@<duration>" for a TTL other than
// defTTL ("with" alone is with-conversation).
func parseMode(s string, defTTL time.Duration) (mode, error) {
	if s == ModeWithout {
		return mode{name: s}, nil
	}
	if s == "with" {
		s = withPrefix + TokenConversation
	}
	rest, ok := strings.CutPrefix(s, withPrefix)
	if !ok {
		return mode{}, fmt.Errorf("--modes: %q is neither without nor with-<%s|%s|%s>[@TTL]", s, TokenConversation, TokenPod, TokenNone)
	}
	token, ttlText, hasTTL := strings.Cut(rest, "@")
	switch token {
	case TokenConversation, TokenPod, TokenNone:
	default:
		return mode{}, fmt.Errorf("--modes: %q: session-token mode %q is none of %s, %s, %s", s, token, TokenConversation, TokenPod, TokenNone)
	}
	m := mode{token: token, ttl: defTTL}
	if hasTTL {
		d, err := time.ParseDuration(ttlText)
		if err != nil || d <= 0 {
			return mode{}, fmt.Errorf("--modes: %q: the TTL after @ must be a positive duration", s)
		}
		m.ttl = d
	}
	m.name = withPrefix + token
	if hasTTL {
		m.name += "@" + m.ttl.String()
	}
	return m, nil
}

// PodSessionToken is the x-session-token llm-d's endpoint picker gives
// every request it sends to the pod namespace/name: base64 (standard
// encoding, padded) of "namespace/name", the pod's NamespacedName. Read
// from llm-d/llm-d-router,
// pkg/epp/framework/plugins/scheduling/util/sessionaffinity/header.go at
// 12a05c102c04a1729ff38a101052d0ffd02ab154: WriteResponseHeader sets
// base64.StdEncoding.EncodeToString([]byte(targetPod.NamespacedName.String()))
// on the response, the client sends it back, and DecodePodName reads it
// with base64.StdEncoding. One value for every conversation on the pod.
func PodSessionToken(namespacedPod string) string {
	return base64.StdEncoding.EncodeToString([]byte(namespacedPod))
}

// sessionHeaders are the headers a conversation's turn carries in mode m:
// header set to the conversation's key, to the pod's token, or absent.
// The without mode sends the conversation's key, which passes to the
// engines unread there.
func (m mode) sessionHeaders(header, convID, podToken string) map[string]string {
	switch m.token {
	case TokenPod:
		return map[string]string{header: podToken}
	case TokenNone:
		return map[string]string{}
	default:
		return map[string]string{header: convID}
	}
}

// describe says how the mode's conversations name themselves.
func (m mode) describe(header, pod string) string {
	switch m.token {
	case "":
		return "no bidirectional KV transfer (" + header + ": one key per conversation, unread)"
	case TokenPod:
		return fmt.Sprintf("%s: %s on every conversation (base64 of %q, as llm-d's endpoint picker sets it)", header, PodSessionToken(pod), pod)
	case TokenNone:
		return "no " + header
	}
	return header + ": one key per conversation"
}
