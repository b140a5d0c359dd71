// Package kvtransfer is the sidecar-driven KV data plane: a prefill-side
// Agent exports registered memory regions and tracks which request holds
// which blocks; a decode-side Puller copies those blocks into the local
// engine's registered KV region, all-or-nothing, verified and bounded by a
// deadline. The bytes move over a Transport (tcp, always built; ucx and nixl
// in sub-packages; an in-memory one for tests).
//
// This file is the whole contract. Every Transport must pass
// kvtransfer/kvtest.RunConformance.
package kvtransfer

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/pd-sidecar/pd-sidecar/failure"
)

// Sentinel errors. Every error a Puller, Conn or Agent returns wraps exactly
// one of them, so callers decide with errors.Is.
var (
	// ErrKVSourceGone: the agent (or the prefiller hosting it) is not
	// reachable, or the connection to it broke mid-pull. The KV is lost with
	// it; callers recompute locally.
	ErrKVSourceGone error = failure.New("kvtransfer: kv source gone", failure.Outcome{Status: http.StatusBadGateway, Reason: failure.ReasonKVSourceGone})
	// ErrKVNotHeld: the agent holds no such request (never held, already
	// pulled, released or lease expired), or the engine id or block ids do
	// not match the hold.
	ErrKVNotHeld = errors.New("kvtransfer: blocks not held by the agent")
	// ErrKVChecksum: a pulled block's CRC-64 differs from the source's.
	ErrKVChecksum = errors.New("kvtransfer: block checksum mismatch")
	// ErrKVSize: block count or size of the grant, the descriptor and the
	// destination disagree.
	ErrKVSize = errors.New("kvtransfer: block size or count mismatch")
	// ErrKVDeadline: the pull did not finish within its deadline.
	ErrKVDeadline = errors.New("kvtransfer: pull deadline exceeded")
	// ErrKVAborted: the caller's context ended (client cancel) mid-pull.
	ErrKVAborted = errors.New("kvtransfer: pull aborted")
	// ErrKVProtocol: the peer sent something the protocol does not allow.
	ErrKVProtocol = errors.New("kvtransfer: protocol error")
	// ErrUnsupported: the transport or memory kind is not available in this
	// build or on this machine (e.g. ucx without -tags ucx, nixl without
	// libnixl_capi.so, cuda without a CUDA build).
	ErrUnsupported = errors.New("kvtransfer: unsupported")
)

// Source is the KV source descriptor a prefill engine puts in its answer
// (kv_transfer_params.kv_source): where the held blocks are and how to check
// them. Its JSON form is specified in connectors/sidecar/CONTRACT.md.
type Source struct {
	// Agent is the agent's address (host:port) for Transport.
	Agent string `json:"agent"`
	// Transport names the transport the agent serves ("tcp", "ucx", "nixl").
	Transport string `json:"transport"`
	// EngineID is the prefill engine's id; the agent refuses others.
	EngineID string `json:"engine_id"`
	// RequestID names the hold on the agent.
	RequestID string `json:"request_id"`
	// BlockIDs are the remote block ids, in prompt order.
	BlockIDs []int `json:"block_ids"`
	// BlockBytes is the size of every block.
	BlockBytes int `json:"block_bytes"`
	// NumTokens is the number of prompt tokens the blocks hold.
	NumTokens int `json:"num_tokens"`
	// Checksums are the CRC-64/ECMA of each whole block, in BlockIDs order;
	// empty when the source gives none (then only sizes are verified).
	Checksums []uint64 `json:"checksums,omitempty"`
	// LeaseMS is the hold's lease at the time of the answer; the blocks are
	// released when it passes without a pull.
	LeaseMS int64 `json:"lease_ms"`
}

// Validate reports a descriptor that cannot be pulled.
func (s Source) Validate() error {
	switch {
	case s.Agent == "" || s.Transport == "" || s.EngineID == "" || s.RequestID == "":
		return errors.New("kv_source: agent, transport, engine_id and request_id are required")
	case len(s.BlockIDs) == 0:
		return errors.New("kv_source: block_ids must not be empty")
	case s.BlockBytes <= 0:
		return errors.New("kv_source: block_bytes must be positive")
	case s.NumTokens <= 0:
		return errors.New("kv_source: num_tokens must be positive")
	case len(s.Checksums) != 0 && len(s.Checksums) != len(s.BlockIDs):
		return errors.New("kv_source: checksums must be empty or one per block")
	}
	return nil
}

// Bytes is the total size of the described blocks.
func (s Source) Bytes() int64 { return int64(len(s.BlockIDs)) * int64(s.BlockBytes) }

// OpenRequest asks an agent for a hold's blocks.
type OpenRequest struct {
	EngineID  string `json:"engine_id"`
	RequestID string `json:"request_id"`
	BlockIDs  []int  `json:"block_ids"`
}

// Grant is the agent's answer to a successful Open: the hold as the agent
// sees it. The hold's lease was renewed by the Open.
type Grant struct {
	RequestID  string   `json:"request_id"`
	BlockIDs   []int    `json:"block_ids"`
	BlockBytes int      `json:"block_bytes"`
	NumTokens  int      `json:"num_tokens"`
	Checksums  []uint64 `json:"checksums,omitempty"`
	// Lease is how long the hold now lasts without another operation.
	Lease time.Duration `json:"lease"`
	// Extra is transport-specific (for ucx: the region's base address and
	// packed remote key). Opaque to everything but the transport.
	Extra []byte `json:"extra,omitempty"`
}

// Transport is one way of moving block bytes from an Agent to pullers.
// Implementations are safe for concurrent use.
type Transport interface {
	// Name is the --kv-transport value ("tcp", "ucx", "nixl", "mem").
	Name() string
	// Listen serves a's holds at addr ("host:port"; port 0 picks one) until
	// ctx ends or the Listener is closed. The agent's regions must be
	// registered before Listen.
	Listen(ctx context.Context, addr string, a *Agent) (Listener, error)
	// Dial returns a connection to the agent at addr. It may connect lazily;
	// an unreachable agent is reported by Dial or by the first operation,
	// wrapping ErrKVSourceGone.
	Dial(ctx context.Context, addr string) (Conn, error)
}

// Listener is a serving agent endpoint.
type Listener interface {
	// Addr is the address pullers dial (the bound port when 0 was asked).
	Addr() string
	// Close stops serving and breaks open connections; pullers then see
	// ErrKVSourceGone. Holds stay with the Agent (they expire by lease).
	Close() error
}

// Conn is a puller's connection to one agent, reused across pulls. It may
// hold several network connections; all methods are safe for concurrent
// use. Every blocking method takes ctx first and returns promptly, wrapping
// ctx's error, when ctx ends.
type Conn interface {
	// Open checks the request against the agent's hold (engine id, request
	// id, block ids), renews its lease and returns the grant. It wraps
	// ErrKVNotHeld when the agent has no matching hold.
	Open(ctx context.Context, req OpenRequest) (Grant, error)
	// Read copies the blocks at positions idx of g.BlockIDs into dst
	// (dst[k] receives block g.BlockIDs[idx[k]]; len(dst[k]) must be
	// g.BlockBytes). It returns nil only when every byte is in dst. On error
	// the contents of dst are undefined. Reads of one grant may run
	// concurrently over disjoint idx. Read writes straight into dst (no
	// intermediate buffer) where the transport allows.
	Read(ctx context.Context, g Grant, idx []int, dst [][]byte) error
	// Complete tells the agent every block was read and verified: the agent
	// releases the hold (reason completed). After Complete no Read of g may
	// follow.
	Complete(ctx context.Context, g Grant) error
	// Release tells the agent the puller gives the hold up (abort): the agent
	// releases it (reason released). Releasing an unknown hold is not an
	// error.
	Release(ctx context.Context, requestID string) error
	// Close closes the network connections. Holds are not released.
	Close() error
}

// Who frees what:
//   - The prefill engine allocates its blocks and hands them to Agent.Hold;
//     from then on the Agent owns the hold and calls AgentConfig.OnRelease
//     exactly once (completed, released or expired), after which the engine
//     may reuse the blocks. A hold being read is released only after the
//     reads in flight end.
//   - The decode side allocates the destination blocks; Puller.Pull never
//     frees them. When Pull returns an error the destination bytes are
//     undefined and the caller must free them and must not hand them to the
//     engine. When Pull returns nil every byte is verified and the remote
//     hold is released.
//   - On any Pull error other than ErrKVSourceGone, Pull releases the remote
//     hold before returning (best effort, bounded by
//     PullerConfig.ReleaseTimeout); the lease covers the rest.

// Prober is an optional ability of a Conn (found by type assertion): it
// reads filler into every block of dst from the agent without any hold,
// over the same path and in the same way as Read moves blocks, to measure
// the path's latency and bandwidth per block size (kv-probe). With no
// blocks it makes the transport's smallest round trip.
type Prober interface {
	Probe(ctx context.Context, dst [][]byte) error
}
