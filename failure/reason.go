package failure

// Fallback reasons, the closed set of pd_sidecar_fallbacks_total{reason}
// (Outcome.Reason).
const (
	// ReasonUnreachable: refused, reset or closed before answering.
	ReasonUnreachable = "unreachable"
	// ReasonTimeout: no answer within --prefill-timeout.
	ReasonTimeout = "timeout"
	// ReasonServerError: the prefiller answered 5xx.
	ReasonServerError = "server_error"
	// ReasonOverloaded: the prefiller answered 429.
	ReasonOverloaded = "overloaded"
	// ReasonNoKVParams: the prefill hit its cap but carried no params.
	ReasonNoKVParams = "no_kv_params"
	// ReasonInvalidParams: the params lack what the decode engine needs.
	ReasonInvalidParams = "invalid_kv_params"
	// ReasonBadAnswer: the prefill answer is not a JSON object, or not an
	// answer the sidecar takes (a status below 200, a malformed head or
	// body, a body past --max-upstream-answer-bytes).
	ReasonBadAnswer = "bad_answer"
	// ReasonTPMismatch: prefill tp_size above --decode-tp-size.
	ReasonTPMismatch = "tp_mismatch"
	// ReasonBadPrefiller: the header is not host:port.
	ReasonBadPrefiller = "invalid_prefiller"
	// ReasonKVLoadFailed: the decode engine failed to load the remote KV,
	// or the sidecar's own pull failed (checksum, size, deadline, lease).
	ReasonKVLoadFailed = "kv_load_failed"
	// ReasonKVSourceGone: the sidecar's pull found the prefiller's KV agent
	// gone (unreachable, or it broke off mid-pull).
	ReasonKVSourceGone = "kv_source_gone"
	// ReasonEOSUnsupported: EOS on the first token, streamed on an API
	// whose stream cannot be synthesised from the prefill answer.
	ReasonEOSUnsupported = "eos_stream_unsupported"
	// ReasonBootstrapFailed: the prefiller's bootstrap server (Mooncake
	// GET /query) gave no usable answer.
	ReasonBootstrapFailed = "bootstrap_failed"
	// ReasonBufferBudget: the prefill's answer (or the bootstrap's, or a
	// KV engine call's) did not fit in --max-buffered-bytes.
	ReasonBufferBudget = "buffered_bytes"
	// ReasonKVWaitTimeout: in MoRI-IO parallel dispatch, the prefill leg
	// gave no outcome, and the decode leg no output, within
	// --moriio-parallel-decode-wait-timeout.
	ReasonKVWaitTimeout = "kv_wait_timeout"
	// ReasonCircuitOpen: the prefiller's circuit breaker is open.
	ReasonCircuitOpen = "circuit_open"
	// ReasonSlowPrefill: the prefill had not answered by the hedge point
	// and the local prefill raced against it was ready first.
	ReasonSlowPrefill = "slow_prefill"
)

// Precedences of the outcomes that win wherever they stand in an error
// (Outcome.Precedence): a client that left, then the sidecar's own
// refusals. Every other outcome has precedence 0: the outermost one an
// error carries wins.
const (
	// PrecedenceBufferBudget: a refusal for want of buffer room.
	PrecedenceBufferBudget = 10 + iota*10
	// PrecedenceCircuitOpen: a prefiller skipped while its circuit is open.
	PrecedenceCircuitOpen
	// PrecedenceDenied: a prefiller, or a KV address, not allowed.
	PrecedenceDenied
	// PrecedenceClientGone: the client left.
	PrecedenceClientGone
)
