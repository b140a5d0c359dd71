package nixl

import "fmt"

// Status is a nixl_capi_status_t.
type Status int

// The nixl_capi_status_t values of NIXL's wrapper.h.
const (
	StatusSuccess           Status = 0
	StatusInProgress        Status = 1
	StatusInProgressWithErr Status = 2 // in progress, at least one entry failed
	StatusInvalidParam      Status = -1
	StatusBackend           Status = -2
	StatusInvalidState      Status = -3
	StatusException         Status = -4
	StatusNoTelemetry       Status = -5
	StatusNotSupported      Status = -6
)

// String returns the C name of s.
func (s Status) String() string {
	switch s {
	case StatusSuccess:
		return "NIXL_CAPI_SUCCESS"
	case StatusInProgress:
		return "NIXL_CAPI_IN_PROG"
	case StatusInProgressWithErr:
		return "NIXL_CAPI_IN_PROG_WITH_ERR"
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
	case StatusNotSupported:
		return "NIXL_CAPI_ERROR_NOT_SUPPORTED"
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
