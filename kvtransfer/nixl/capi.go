//go:build cgo

package nixl

/*
#cgo LDFLAGS: -ldl
#include <stdlib.h>
#include "capi.h"
*/
import "C"

import (
	"unsafe"
)

// Lib is a loaded NIXL C API library: its nixl_capi_* function table. It
// stays loaded for the life of the process (dlopen is reference counted;
// unloading a library with NIXL's threads running is not safe).
type Lib struct {
	path string
	c    *C.nx_lib
}

// Open loads NIXL's C API library from path (a path, or a file name the
// dynamic loader searches for; "" means DefaultLibrary) and resolves every
// symbol the binding uses. A missing library, a missing symbol or NIXL's
// stub build is an error wrapping ErrLibraryMissing and
// kvtransfer.ErrUnsupported, naming the library and NIXL_CAPI_LIB.
func Open(path string) (*Lib, error) {
	if path == "" {
		path = DefaultLibrary
	}
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	l := (*C.nx_lib)(C.calloc(1, C.sizeof_nx_lib))
	var why *C.char
	switch rc := C.nx_open(cpath, l, &why); {
	case rc < 0:
		msg := C.GoString(why)
		C.free(unsafe.Pointer(l))
		return nil, missing(path, msg)
	case rc > 0:
		C.free(unsafe.Pointer(l))
		return nil, missing(path, "symbol "+C.GoString(C.nx_name(rc-1))+" not found: not NIXL's nixl_capi_* wrapper, or an older one")
	}
	if C.nx_is_stub(l) {
		return nil, missing(path, "nixl_capi_is_stub() is true: NIXL's stub build")
	}
	return &Lib{path: path, c: l}, nil
}

// Path is the library as given to Open.
func (l *Lib) Path() string { return l.path }

// call turns a status of function fn (an NX_* index) into an error.
func call(fn C.int, st C.nx_status) error {
	if st == 0 {
		return nil
	}
	return &CallError{Func: C.GoString(C.nx_name(fn)), Status: Status(st)}
}

func cDescs(ds []Desc) []C.nx_desc {
	out := make([]C.nx_desc, len(ds))
	for i, d := range ds {
		out[i] = C.nx_desc{addr: C.uintptr_t(d.Addr), len: C.size_t(d.Len), dev: C.uint64_t(d.DevID)}
	}
	return out
}

// descPtr is the C view of ds (nil when empty).
func descPtr(ds []C.nx_desc) *C.nx_desc {
	if len(ds) == 0 {
		return nil
	}
	return &ds[0]
}
