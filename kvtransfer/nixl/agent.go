//go:build cgo

package nixl

/*
#include <stdlib.h>
#include "capi.h"
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"time"
	"unsafe"
)

// Agent is a NIXL agent (nixl_capi_agent_t) with one backend and the
// optional arguments naming it. NIXL's C wrapper creates agents with the
// default thread-sync mode, so every call into one Agent is serialised by
// a mutex; the calls are short (transfers are posted and polled).
type Agent struct {
	lib     *Lib
	name    string
	drain   time.Duration // how long Release waits for a running transfer
	mu      sync.Mutex
	h       unsafe.Pointer // nixl_capi_agent_t
	backend unsafe.Pointer // nixl_capi_backend_t
	opt     unsafe.Pointer // nixl_capi_opt_args_t naming the backend
}

// NewAgent creates the agent called name (unique in the fabric: remote
// agents key its metadata by it) and its backend plugin (e.g. "UCX") with
// the plugin's default parameters, its progress thread polling with
// DefaultProgressDelay.
func (l *Lib) NewAgent(name, backend string) (*Agent, error) {
	return l.newAgent(name, backend, DefaultProgressDelay)
}

// newAgent is NewAgent with the progress thread's poll timeout.
func (l *Lib) newAgent(name, backend string, progressDelay time.Duration) (*Agent, error) {
	cname, cplugin := C.CString(name), C.CString(backend)
	defer C.free(unsafe.Pointer(cname))
	defer C.free(unsafe.Pointer(cplugin))
	a := &Agent{lib: l, name: name, drain: DefaultDrainTimeout}
	st := C.nx_create_agent(l.c, cname, C.uint64_t(progressDelay.Microseconds()), &a.h)
	if st != 0 {
		fn := "nixl_capi_create_agent"
		if C.nx_has_configured_agent(l.c) {
			fn = "nixl_capi_create_configured_agent"
		}
		return nil, fmt.Errorf("nixl agent %s: %w", name, &CallError{Func: fn, Status: Status(st)})
	}
	var mems, params unsafe.Pointer
	if err := call(C.NX_GET_PLUGIN_PARAMS, C.nx_get_plugin_params(l.c, a.h, cplugin, &mems, &params)); err != nil {
		a.Close()
		return nil, fmt.Errorf("nixl agent %s: backend plugin %s (is NIXL_PLUGIN_DIR set?): %w", name, backend, err)
	}
	err := call(C.NX_CREATE_BACKEND, C.nx_create_backend(l.c, a.h, cplugin, params, &a.backend))
	C.nx_destroy_mem_list(l.c, mems)
	C.nx_destroy_params(l.c, params)
	if err != nil {
		a.Close()
		return nil, fmt.Errorf("nixl agent %s: backend %s: %w", name, backend, err)
	}
	if err := call(C.NX_CREATE_OPT_ARGS, C.nx_create_opt_args(l.c, &a.opt)); err != nil {
		a.Close()
		return nil, fmt.Errorf("nixl agent %s: %w", name, err)
	}
	if err := call(C.NX_OPT_ARGS_ADD_BACKEND, C.nx_opt_args_add_backend(l.c, a.opt, a.backend)); err != nil {
		a.Close()
		return nil, fmt.Errorf("nixl agent %s: %w", name, err)
	}
	return a, nil
}

// Name is the agent's name.
func (a *Agent) Name() string { return a.name }

// Register registers memory with the agent's backend
// (nixl_capi_register_mem of a reg descriptor list).
func (a *Agent) Register(mem MemType, descs []Desc) error {
	return a.regOp(mem, descs, false)
}

// Deregister undoes Register for the same descriptors.
func (a *Agent) Deregister(mem MemType, descs []Desc) error {
	return a.regOp(mem, descs, true)
}

func (a *Agent) regOp(mem MemType, descs []Desc, dereg bool) error {
	cd := cDescs(descs)
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.h == nil {
		return fmt.Errorf("nixl agent %s is closed: %w", a.name, ErrCall)
	}
	var dl unsafe.Pointer
	var fn C.int
	st := C.nx_reg_dlist(a.lib.c, C.int(mem), descPtr(cd), C.size_t(len(cd)), &dl, &fn)
	if err := call(fn, st); err != nil {
		return err
	}
	defer C.nx_destroy_reg_dlist(a.lib.c, dl)
	if dereg {
		return call(C.NX_DEREGISTER_MEM, C.nx_deregister_mem(a.lib.c, a.h, dl, a.opt))
	}
	return call(C.NX_REGISTER_MEM, C.nx_register_mem(a.lib.c, a.h, dl, a.opt))
}

// LocalMD returns the agent's metadata (nixl_capi_get_local_md): what a
// remote agent loads to reach this one's registered memory.
func (a *Agent) LocalMD() ([]byte, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	var data unsafe.Pointer
	var n C.size_t
	if err := call(C.NX_GET_LOCAL_MD, C.nx_get_local_md(a.lib.c, a.h, &data, &n)); err != nil {
		return nil, err
	}
	defer C.free(data) // malloc'ed by the wrapper
	return C.GoBytes(data, C.int(n)), nil
}

// LoadRemoteMD loads a remote agent's metadata (nixl_capi_load_remote_md)
// and returns that agent's name.
func (a *Agent) LoadRemoteMD(md []byte) (string, error) {
	if len(md) == 0 {
		return "", fmt.Errorf("empty remote metadata: %w", ErrCall)
	}
	cmd := C.CBytes(md)
	defer C.free(cmd)
	a.mu.Lock()
	defer a.mu.Unlock()
	var name *C.char
	if err := call(C.NX_LOAD_REMOTE_MD, C.nx_load_remote_md(a.lib.c, a.h, cmd, C.size_t(len(md)), &name)); err != nil {
		return "", err
	}
	defer C.free(unsafe.Pointer(name)) // strdup'ed by the wrapper
	return C.GoString(name), nil
}

// InvalidateRemoteMD forgets a remote agent's metadata.
func (a *Agent) InvalidateRemoteMD(remote string) error {
	cname := C.CString(remote)
	defer C.free(unsafe.Pointer(cname))
	a.mu.Lock()
	defer a.mu.Unlock()
	return call(C.NX_INVALIDATE_REMOTE_MD, C.nx_invalidate_remote_md(a.lib.c, a.h, cname))
}

// Xfer is a posted transfer request (nixl_capi_xfer_req_t). Wait for it,
// then Release it, exactly once.
type Xfer struct {
	a   *Agent
	req unsafe.Pointer
}

// Transfer creates and posts a transfer between local descriptors (which
// must be registered with a) and the remote agent's (registered there),
// pairwise: local[i] and remote[i] have the same length. With OpRead the
// remote bytes land in local memory.
func (a *Agent) Transfer(op XferOp, mem, remoteMem MemType, local, remote []Desc, remoteAgent string) (*Xfer, error) {
	if len(local) != len(remote) || len(local) == 0 {
		return nil, fmt.Errorf("nixl transfer of %d local and %d remote descriptors: %w", len(local), len(remote), ErrCall)
	}
	cl, cr := cDescs(local), cDescs(remote)
	cname := C.CString(remoteAgent)
	defer C.free(unsafe.Pointer(cname))
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.h == nil {
		return nil, fmt.Errorf("nixl agent %s is closed: %w", a.name, ErrCall)
	}
	var ll, rl unsafe.Pointer
	var fn C.int
	st := C.nx_xfer_dlist(a.lib.c, C.int(mem), descPtr(cl), C.size_t(len(cl)), &ll, &fn)
	if err := call(fn, st); err != nil {
		return nil, err
	}
	defer C.nx_destroy_xfer_dlist(a.lib.c, ll)
	st = C.nx_xfer_dlist(a.lib.c, C.int(remoteMem), descPtr(cr), C.size_t(len(cr)), &rl, &fn)
	if err := call(fn, st); err != nil {
		return nil, err
	}
	defer C.nx_destroy_xfer_dlist(a.lib.c, rl)
	x := &Xfer{a: a}
	if err := call(C.NX_CREATE_XFER_REQ, C.nx_create_xfer_req(a.lib.c, a.h, C.int(op), ll, rl, cname, &x.req, a.opt)); err != nil {
		return nil, err
	}
	switch st := Status(C.nx_post_xfer_req(a.lib.c, a.h, x.req, a.opt)); st {
	case StatusSuccess, StatusInProgress:
		return x, nil
	default:
		x.releaseLocked()
		return nil, &CallError{Func: "nixl_capi_post_xfer_req", Status: st}
	}
}

// Status polls the request (nixl_capi_get_xfer_status): StatusSuccess when
// done, StatusInProgress while running, else a CallError.
func (x *Xfer) Status() (Status, error) {
	x.a.mu.Lock()
	defer x.a.mu.Unlock()
	if x.a.h == nil {
		return StatusInvalidState, fmt.Errorf("nixl agent %s is closed: %w", x.a.name, ErrCall)
	}
	switch st := Status(C.nx_get_xfer_status(x.a.lib.c, x.a.h, x.req)); st {
	case StatusSuccess, StatusInProgress:
		return st, nil
	default:
		return st, &CallError{Func: "nixl_capi_get_xfer_status", Status: st}
	}
}

// Wait polls until the transfer is done, fails, or ctx ends (then it
// returns ctx's error; the transfer may still be running: Release it).
// Polling backs off from a few immediate retries to 1 ms.
func (x *Xfer) Wait(ctx context.Context) error {
	delay := time.Duration(0)
	for spins := 0; ; spins++ {
		st, err := x.Status()
		if err != nil {
			return err
		}
		if st == StatusSuccess {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if spins < 16 {
			runtime.Gosched()
			continue
		}
		delay = min(max(2*delay, 5*time.Microsecond), time.Millisecond)
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
		}
	}
}

// Release waits for the transfer to end, then releases the request
// (nixl_capi_release_xfer_req) and frees its handle: local memory is not
// written after Release returns. It never asks NIXL to abort a running
// transfer: NIXL 0.7.1's UCX backend answers such a release with success
// at once while the data keeps landing (all 64 MiB of a READ released 2 ms
// in arrived afterwards). A transfer still running after the agent's
// drain time (DefaultDrainTimeout) is released all the same, and the error
// says its memory may still be written.
func (x *Xfer) Release() error {
	ctx, cancel := context.WithTimeout(context.Background(), x.a.drain)
	werr := x.Wait(ctx) // nil, or the transfer failed: either way it has ended
	cancel()
	x.a.mu.Lock()
	err := x.releaseLocked()
	x.a.mu.Unlock()
	if errors.Is(werr, context.DeadlineExceeded) {
		return errors.Join(fmt.Errorf("nixl transfer of agent %s still running after %v, released anyway: its local memory may still be written: %w",
			x.a.name, x.a.drain, ErrCall), err)
	}
	return err
}

func (x *Xfer) releaseLocked() error {
	if x.req == nil || x.a.h == nil {
		return nil
	}
	if err := call(C.NX_RELEASE_XFER_REQ, C.nx_release_xfer_req(x.a.lib.c, x.a.h, x.req)); err != nil {
		return err
	}
	err := call(C.NX_DESTROY_XFER_REQ, C.nx_destroy_xfer_req(x.a.lib.c, x.req))
	x.req = nil
	return err
}

// Read reads remote into local (registered) memory and waits for it,
// releasing the request in every case.
func (a *Agent) Read(ctx context.Context, mem, remoteMem MemType, local, remote []Desc, remoteAgent string) error {
	x, err := a.Transfer(OpRead, mem, remoteMem, local, remote, remoteAgent)
	if err != nil {
		return err
	}
	werr := x.Wait(ctx)
	rerr := x.Release()
	return errors.Join(werr, rerr)
}

// Close destroys the backend, the optional arguments and the agent.
// Transfers still held are abandoned (NIXL releases them with the agent).
func (a *Agent) Close() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.opt != nil {
		C.nx_destroy_opt_args(a.lib.c, a.opt)
		a.opt = nil
	}
	if a.h != nil {
		C.nx_destroy_agent(a.lib.c, a.h)
		a.h = nil
	}
	if a.backend != nil {
		// The agent owns the backend engine; this frees the C handle.
		C.nx_destroy_backend(a.lib.c, a.backend)
		a.backend = nil
	}
}
