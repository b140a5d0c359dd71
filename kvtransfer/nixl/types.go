package nixl

import "fmt"

// Status is a nixl_capi_status_t.
type Status int

// The nixl_capi_status_t values of NIXL's wrapper.h. Release 0.7.1 returns
// StatusBackend for every failure; later versions report NIXL's own status
// (StatusNotFound: the remote agent's metadata is not loaded, or no backend
// serves the request).
const (
	StatusSuccess      Status = 0
	StatusInProgress   Status = 1
	StatusInvalidParam Status = -1
	StatusBackend      Status = -2
	StatusInvalidState Status = -3
	StatusException    Status = -4
	StatusNoTelemetry  Status = -5
	StatusNotFound     Status = -6
)

// String returns the C name of s.
func (s Status) String() string {
	switch s {
	case StatusSuccess:
		return "NIXL_CAPI_SUCCESS"
	case StatusInProgress:
		return "NIXL_CAPI_IN_PROG"
	case StatusInvalidParam:
		return "NIXL_CAPI_ERROR_INVALID_PARAM"
	case StatusBackend:
		return "NIXL_CAPI_ERROR_BACKEND"
	case StatusInvalidState:
		return "NIXL_CAPI_ERROR_INVALID_STATE"
	case StatusException:
		return "NIXL_CAPI_ERROR_EXCEPTION"
	case StatusNoTelemetry:
		return "NIXL_CAPI_ERROR_NO_TELEMETRY"
	case StatusNotFound:
		return "NIXL_CAPI_ERROR_NOT_FOUND"
	}
	return fmt.Sprintf("nixl_capi_status_t(%d)", int(s))
}

// CallError is a nixl_capi_* call that returned an error status. It wraps
// ErrCall.
type CallError struct {
	// Func is the C function, e.g. "nixl_capi_post_xfer_req".
	Func string
	// Status is what it returned.
	Status Status
}

// Error names the function and the status.
func (e *CallError) Error() string {
	return fmt.Sprintf("%s: %s (%d)", e.Func, e.Status, int(e.Status))
}

// Unwrap returns ErrCall.
func (e *CallError) Unwrap() error { return ErrCall }

// MemType is a nixl_capi_mem_type_t.
type MemType int

// Memory types of NIXL's wrapper.h. The transport registers kvtransfer
// host regions as MemDRAM; MemVRAM is for cuda regions (CUDA builds).
const (
	MemDRAM MemType = 0
	MemVRAM MemType = 1
)

// XferOp is a nixl_capi_xfer_op_t.
type XferOp int

// Transfer operations: the initiator reads from or writes to the remote.
const (
	OpRead  XferOp = 0
	OpWrite XferOp = 1
)

// Desc is one NIXL descriptor: Len bytes at Addr on device DevID (0 for
// DRAM).
type Desc struct {
	Addr  uintptr
	Len   int
	DevID uint64
}
