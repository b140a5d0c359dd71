package kvtransfer

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// The tcp wire protocol. Every exchange is one request frame from the
// puller and one response frame from the agent, on one of several pooled
// connections (no pipelining):
//
//	request:  op (1 byte) | payload length (4 bytes, big endian) | JSON payload
//	response: status (1 byte) | payload length (4) | payload
//
// A successful read response has an 8-byte payload, the number of raw bytes
// that follow it: the blocks, in idx order, with no framing between them, so
// the puller reads them straight into the destination. A probe response is
// the same with filler bytes. An info response's payload is the
// transport's opaque description of the agent (TCPConfig.Info).
const (
	opOpen     byte = 1
	opRead     byte = 2
	opComplete byte = 3
	opRelease  byte = 4
	opProbe    byte = 5
	opInfo     byte = 6
)

// Response statuses; each non-zero one maps back to a sentinel.
const (
	stOK       byte = 0
	stNotHeld  byte = 1
	stProtocol byte = 2
	stSize     byte = 3
)

// maxFrame bounds a control payload; maxProbe bounds a probe's bytes.
const (
	maxFrame = 4 << 20
	maxProbe = 1 << 30
)

type readReq struct {
	RequestID string `json:"request_id"`
	Idx       []int  `json:"idx"`
}

type releaseReq struct {
	RequestID string `json:"request_id"`
}

type probeReq struct {
	Size int64 `json:"size"`
}

func writeFrame(w io.Writer, kind byte, payload []byte) error {
	buf := make([]byte, 5+len(payload))
	buf[0] = kind
	binary.BigEndian.PutUint32(buf[1:5], uint32(len(payload)))
	copy(buf[5:], payload)
	_, err := w.Write(buf)
	return err
}

func writeJSONFrame(w io.Writer, kind byte, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("%w: encode: %w", ErrKVProtocol, err)
	}
	return writeFrame(w, kind, b)
}

func readFrame(r io.Reader) (byte, []byte, error) {
	var hdr [5]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(hdr[1:])
	if n > maxFrame {
		return 0, nil, fmt.Errorf("%w: frame of %d bytes", ErrKVProtocol, n)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		return 0, nil, err
	}
	return hdr[0], b, nil
}

// statusOf maps an agent error to a wire status.
func statusOf(err error) byte {
	switch {
	case errors.Is(err, ErrKVNotHeld):
		return stNotHeld
	case errors.Is(err, ErrKVSize):
		return stSize
	}
	return stProtocol
}

// errOf maps a wire status and message back to a sentinel error.
func errOf(st byte, msg []byte) error {
	switch st {
	case stNotHeld:
		return fmt.Errorf("agent: %s: %w", msg, ErrKVNotHeld)
	case stSize:
		return fmt.Errorf("agent: %s: %w", msg, ErrKVSize)
	}
	return fmt.Errorf("agent: %s: %w", msg, ErrKVProtocol)
}
