package connectors

// KVReleaser is an optional ability of a Sequential connector whose decode
// engine pulls the KV from the prefiller (nixlv2): the prefill engine holds
// the prompt's blocks until a decoder has read them. ReleaseBody returns the
// body of a minimal decode leg for a handoff whose decode never read the
// KV (the client left first): the decode body (DecodeBody) capped at one
// output token and not streamed, appended to dst[:0]. Sent to the decode
// engine, it reads the blocks and the prefill engine frees them at once
// instead of when its own abort timeout ends. Connectors whose prefiller
// pushes the KV (sglang, mooncake) or that keep it in a shared store
// (shared-storage, offloading) pin nothing on the prefiller for a decoder
// that never comes, and do not implement it.
type KVReleaser interface {
	ReleaseBody(dst []byte, api API, body []byte, h Handoff) ([]byte, error)
}
