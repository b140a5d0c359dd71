//go:build ucx

package ucx

/*
#cgo pkg-config: ucx
#include <ucp/api/ucp.h>
#include <ucs/debug/log_def.h>
#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// px_init creates a context with one-sided RMA and wake-up events and a
// worker whose every call the Go side serialises (SERIALIZED: no lock of
// UCX's own on each operation; UCX's async thread takes care of itself).
// tls, when not NULL, replaces UCX_TLS for this context.
static ucs_status_t px_init(ucp_context_h *ctx, ucp_worker_h *w, int wakeup, const char *tls) {
	ucp_config_t *cfg;
	ucs_status_t st = ucp_config_read(NULL, NULL, &cfg);
	if (st != UCS_OK) return st;
	if (tls != NULL && (st = ucp_config_modify(cfg, "TLS", tls)) != UCS_OK) {
		ucp_config_release(cfg);
		return st;
	}
	ucp_params_t p;
	memset(&p, 0, sizeof p);
	p.field_mask = UCP_PARAM_FIELD_FEATURES;
	p.features = UCP_FEATURE_RMA | (wakeup ? UCP_FEATURE_WAKEUP : 0);
	st = ucp_init(&p, cfg, ctx);
	ucp_config_release(cfg);
	if (st != UCS_OK) return st;
	ucp_worker_params_t wp;
	memset(&wp, 0, sizeof wp);
	wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
	wp.thread_mode = UCS_THREAD_MODE_MULTI;
	st = ucp_worker_create(*ctx, &wp, w);
	if (st != UCS_OK) ucp_cleanup(*ctx);
	return st;
}

// px_address copies the worker's address into C memory the caller frees.
static ucs_status_t px_address(ucp_worker_h w, void **out, size_t *len) {
	ucp_address_t *a;
	ucs_status_t st = ucp_worker_get_address(w, &a, len);
	if (st != UCS_OK) return st;
	*out = malloc(*len);
	if (*out == NULL) { ucp_worker_release_address(w, a); return UCS_ERR_NO_MEMORY; }
	memcpy(*out, a, *len);
	ucp_worker_release_address(w, a);
	return UCS_OK;
}

// A peer that vanishes (a puller cancelled mid-pull, an agent killed) fails
// its endpoint. Without an error handler UCX treats that as fatal and aborts
// the whole process; with one, the endpoint's operations complete with an
// error status, which the Go side maps to ErrKVSourceGone or an aborted
// pull, and the endpoint is destroyed when its connection is closed.
static void px_on_ep_error(void *arg, ucp_ep_h ep, ucs_status_t st) {
	(void)arg; (void)ep; (void)st;
}

// px_connect creates an endpoint to a remote worker address, the way
// ucx_perftest does, with peer failure detection: every transport both
// workers share that can detect a peer's failure can carry it (tcp, cma,
// rc/dc verbs; not UCX's sysv and posix shared memory, which the
// shared-memory worker serves, see px_connect_local).
static ucs_status_t px_connect(ucp_worker_h w, const void *addr, ucp_ep_h *ep) {
	ucp_ep_params_t p;
	memset(&p, 0, sizeof p);
	p.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
		UCP_EP_PARAM_FIELD_ERR_HANDLER;
	p.address = (const ucp_address_t *)addr;
	p.err_mode = UCP_ERR_HANDLING_MODE_PEER;
	p.err_handler.cb = px_on_ep_error;
	return ucp_ep_create(w, &p, ep);
}

// px_quiet_select swallows the transport selection's error lines while an
// endpoint is tried on the shared-memory worker: an agent on another host
// is expected to be unreachable there, and the main worker is tried next.
static ucs_log_func_rc_t px_quiet_select(const char *file, unsigned line, const char *function,
		ucs_log_level_t level, const ucs_log_component_config_t *comp, const char *msg, va_list ap) {
	(void)line; (void)function; (void)comp; (void)msg; (void)ap;
	if (level <= UCS_LOG_LEVEL_ERROR && file != NULL && strstr(file, "select.c") != NULL)
		return UCS_LOG_FUNC_RC_STOP;
	return UCS_LOG_FUNC_RC_CONTINUE;
}

// px_tls is the UCX_TLS in effect (environment or UCX's configuration
// files), as ucp_config_print writes it, in C memory the caller frees;
// NULL when it cannot be read.
static char *px_tls(void) {
	ucp_config_t *cfg;
	if (ucp_config_read(NULL, NULL, &cfg) != UCS_OK) return NULL;
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	if (f == NULL) { ucp_config_release(cfg); return NULL; }
	ucp_config_print(cfg, f, NULL, UCS_CONFIG_PRINT_CONFIG);
	fclose(f);
	ucp_config_release(cfg);
	return buf;
}

// px_connect_local creates an endpoint without peer failure detection on
// the shared-memory worker (sysv and posix only: see localTLS).
static ucs_status_t px_connect_local(ucp_worker_h w, const void *addr, ucp_ep_h *ep) {
	ucp_ep_params_t p;
	memset(&p, 0, sizeof p);
	p.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
	p.address = (const ucp_address_t *)addr;
	p.err_mode = UCP_ERR_HANDLING_MODE_NONE;
	ucs_log_push_handler(px_quiet_select);
	ucs_status_t st = ucp_ep_create(w, &p, ep);
	ucs_log_pop_handler();
	return st;
}

static ucs_status_t px_mem_map(ucp_context_h c, uintptr_t addr, size_t len, ucp_mem_h *m) {
	ucp_mem_map_params_t p;
	memset(&p, 0, sizeof p);
	p.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
	p.address = (void *)addr;
	p.length = len;
	return ucp_mem_map(c, &p, m);
}

// px_mem_alloc has UCX allocate and map len bytes (shared memory it can
// hand to a peer on the same host, as ucx_perftest's buffers are).
static ucs_status_t px_mem_alloc(ucp_context_h c, size_t len, ucp_mem_h *m, void **addr) {
	ucp_mem_map_params_t p;
	memset(&p, 0, sizeof p);
	p.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH | UCP_MEM_MAP_PARAM_FIELD_FLAGS;
	p.address = NULL;
	p.length = len;
	p.flags = UCP_MEM_MAP_ALLOCATE;
	ucs_status_t st = ucp_mem_map(c, &p, m);
	if (st != UCS_OK) return st;
	ucp_mem_attr_t a;
	a.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS;
	st = ucp_mem_query(*m, &a);
	if (st != UCS_OK) { ucp_mem_unmap(c, *m); return st; }
	*addr = a.address;
	return UCS_OK;
}

// px_pull is one batch of one-sided reads: n gets, at most window in
// flight, issued and completed by px_pump. Its arrays are C memory.
typedef struct {
	ucp_ep_h ep;
	ucp_rkey_h rk;
	uintptr_t *dst;
	uint64_t *raddr;
	size_t *len;
	int n, next, inflight, done, window, stop;
	ucs_status_t err;
} px_pull;

static void px_get_done(void *req, ucs_status_t st, void *user) {
	px_pull *p = user;
	p->inflight--;
	p->done++;
	if (st != UCS_OK && p->err == UCS_OK) p->err = st;
	ucp_request_free(req);
}

// px_pump issues gets up to the window and progresses the worker, at most
// spins times; it returns 1 when the batch is over: every get done, or an
// error (or a stop) with nothing left in flight. It never blocks, so the
// Go side can watch its context between calls.
static int px_pump(ucp_worker_h w, px_pull *p, int spins) {
	for (int i = 0; i < spins; i++) {
		while (p->err == UCS_OK && !p->stop && p->next < p->n && p->inflight < p->window) {
			ucp_request_param_t rp;
			memset(&rp, 0, sizeof rp);
			rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
			rp.cb.send = px_get_done;
			rp.user_data = p;
			int k = p->next++;
			ucs_status_ptr_t r = ucp_get_nbx(p->ep, (void *)p->dst[k], p->len[k], p->raddr[k], p->rk, &rp);
			if (r == NULL) {
				p->done++;
			} else if (UCS_PTR_IS_ERR(r)) {
				p->done++;
				p->err = UCS_PTR_STATUS(r);
			} else {
				p->inflight++;
			}
		}
		if (p->done == p->n || ((p->err != UCS_OK || p->stop) && p->inflight == 0)) return 1;
		ucp_worker_progress(w);
	}
	return 0;
}

// px_drain progresses w until it has nothing to do; it returns how many
// progress calls made progress.
static int px_drain(ucp_worker_h w) {
	int n = 0;
	while (ucp_worker_progress(w)) n++;
	return n;
}

// px_wait_fd waits at most ms milliseconds for the armed worker's event
// file descriptor.
static void px_wait_fd(int efd, int ms) {
	struct pollfd pfd = { .fd = efd, .events = POLLIN };
	poll(&pfd, 1, ms);
}

static void px_close_ep(ucp_worker_h w, ucp_ep_h ep) {
	ucp_request_param_t p;
	memset(&p, 0, sizeof p);
	p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
	p.flags = UCP_EP_CLOSE_FLAG_FORCE;
	ucs_status_ptr_t r = ucp_ep_close_nbx(ep, &p);
	if (r != NULL && !UCS_PTR_IS_ERR(r)) {
		while (ucp_request_check_status(r) == UCS_INPROGRESS) ucp_worker_progress(w);
		ucp_request_free(r);
	}
}

// px_flush starts flushing every endpoint of w, wire-up messages still
// pending on them included; it returns 1 and the request in *req while the
// flush is under way, 0 when it is over already (done or failed).
static int px_flush(ucp_worker_h w, void **req) {
	ucp_request_param_t p;
	memset(&p, 0, sizeof p);
	ucs_status_ptr_t r = ucp_worker_flush_nbx(w, &p);
	if (r == NULL || UCS_PTR_IS_ERR(r)) { *req = NULL; return 0; }
	*req = r;
	return 1;
}

// px_busy progresses w at most spins times while r is in progress; it
// returns 1 while r still is.
static int px_busy(ucp_worker_h w, void *r, int spins) {
	for (int i = 0; i < spins; i++) {
		if (ucp_request_check_status(r) != UCS_INPROGRESS) return 0;
		ucp_worker_progress(w);
	}
	return ucp_request_check_status(r) == UCS_INPROGRESS;
}

static void px_request_free(void *r) { ucp_request_free(r); }

// px_ep_info is ucp_ep_print_info's text, in C memory the caller frees.
static char *px_ep_info(ucp_ep_h ep) {
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	if (f == NULL) return NULL;
	ucp_ep_print_info(ep, f);
	fclose(f);
	return buf;
}
*/
import "C"

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
)

// Version is the version of the UCX library in use.
func Version() string { return C.GoString(C.ucp_get_version_string()) }

// statusErr names a UCS status.
func statusErr(op string, st C.ucs_status_t) error {
	return fmt.Errorf("%s: %s (%d)", op, C.GoString(C.ucs_status_string(st)), int(st))
}

// worker is one UCP context and worker. Every UCP call on it is made under
// mu. Between operations a goroutine progresses it, sleeping on the
// worker's event file descriptor while nothing happens (an agent answers
// software RMA, e.g. over tcp, and every worker answers UCX's wire-up and
// keepalive messages); a pull progresses the worker itself while it waits.
type worker struct {
	mu   sync.Mutex
	ctx  C.ucp_context_h
	w    C.ucp_worker_h
	efd  C.int // -1: no wake-up events; the loop polls with a back-off
	addr []byte
	// pumping counts gets under way: they progress the worker themselves,
	// and the progress loop leaves the mutex to them meanwhile.
	pumping atomic.Int32
	stop    chan struct{}
	done    chan struct{}
}

// newWorker creates a worker over the transports UCX's configuration
// names, or over tls when it is not empty.
func newWorker(tls string) (*worker, error) {
	wk := &worker{efd: -1, stop: make(chan struct{}), done: make(chan struct{})}
	var ctls *C.char
	if tls != "" {
		ctls = C.CString(tls)
		defer C.free(unsafe.Pointer(ctls))
	}
	st := C.px_init(&wk.ctx, &wk.w, 1, ctls)
	if st != C.UCS_OK {
		// Some transport sets cannot raise events: progress by polling.
		if st = C.px_init(&wk.ctx, &wk.w, 0, ctls); st != C.UCS_OK {
			return nil, statusErr("ucp init", st)
		}
	} else {
		var fd C.int
		if C.ucp_worker_get_efd(wk.w, &fd) == C.UCS_OK {
			wk.efd = fd
		}
	}
	var buf unsafe.Pointer
	var n C.size_t
	if st := C.px_address(wk.w, &buf, &n); st != C.UCS_OK {
		C.ucp_worker_destroy(wk.w)
		C.ucp_cleanup(wk.ctx)
		return nil, statusErr("ucp_worker_get_address", st)
	}
	wk.addr = C.GoBytes(buf, C.int(n))
	C.free(buf)
	go wk.progressLoop()
	return wk, nil
}

// progressLoop progresses the worker between operations: it sleeps on the
// event file descriptor (50 ms at most, to see a stop) or, without one,
// backs off to 1 ms while idle.
func (wk *worker) progressLoop() {
	defer close(wk.done)
	idle := 0
	var busy time.Time
	for {
		select {
		case <-wk.stop:
			return
		default:
		}
		if wk.pumping.Load() > 0 {
			busy = time.Now()
			time.Sleep(time.Millisecond)
			continue
		}
		wk.mu.Lock()
		n := C.px_drain(wk.w)
		armed := C.ucs_status_t(C.UCS_ERR_UNSUPPORTED)
		if n == 0 && wk.efd >= 0 {
			armed = C.ucp_worker_arm(wk.w)
		}
		wk.mu.Unlock()
		if n > 0 || armed == C.UCS_ERR_BUSY {
			idle, busy = 0, time.Now()
			continue
		}
		if time.Since(busy) < spinAfterWork {
			// Work comes in bursts (a pull's gets, emulated over the
			// am lane, each need this worker): keep polling a while.
			runtime.Gosched()
			continue
		}
		if armed == C.UCS_OK {
			// Sleep outside mu: a pull may progress meanwhile.
			C.px_wait_fd(wk.efd, 50)
			continue
		}
		idle++
		time.Sleep(time.Duration(min(idle, 100)) * 10 * time.Microsecond)
	}
}

// closeFlush bounds how long closing a worker waits for its endpoints'
// pending messages.
const closeFlush = 2 * time.Second

// close stops the progress loop, flushes the worker and destroys it.
//
// The flush comes first because UCX 1.13 asserts, aborting the process, when
// ucp_worker_destroy purges an endpoint that still has a wire-up reply
// pending (a puller's endpoint whose wire-up the agent answered just before
// it closed: "got REP message" in ucp_request_send_state_ff). Progressing
// the worker until the flush completes sends those messages. A flush still
// under way after closeFlush (a peer that neither answers nor fails) leaves
// the worker undestroyed: its memory is lost, the process is not.
func (wk *worker) close() {
	close(wk.stop)
	wk.mu.Lock()
	C.ucp_worker_signal(wk.w)
	wk.mu.Unlock()
	<-wk.done
	wk.mu.Lock()
	defer wk.mu.Unlock()
	if !wk.flushLocked(closeFlush) {
		return
	}
	C.px_drain(wk.w)
	C.ucp_worker_destroy(wk.w)
	C.ucp_cleanup(wk.ctx)
}

// flushLocked flushes the worker, progressing it, for at most bound; it
// reports whether the flush is over. Call under mu.
func (wk *worker) flushLocked(bound time.Duration) bool {
	var req unsafe.Pointer
	if C.px_flush(wk.w, &req) == 0 {
		return true
	}
	deadline := time.Now().Add(bound)
	for C.px_busy(wk.w, req, pumpSpins) != 0 {
		if time.Now().After(deadline) {
			// Freed now, UCX releases it when it completes.
			C.px_request_free(req)
			return false
		}
		runtime.Gosched()
	}
	C.px_request_free(req)
	return true
}

// memReg is one registered region.
type memReg struct {
	memh C.ucp_mem_h
	base uintptr
	rkey []byte
}

func (wk *worker) memMap(base uintptr, size int) (*memReg, error) {
	if size == 0 {
		return nil, errors.New("ucp mem map: empty region")
	}
	m := &memReg{base: base}
	wk.mu.Lock()
	defer wk.mu.Unlock()
	if st := C.px_mem_map(wk.ctx, C.uintptr_t(m.base), C.size_t(size), &m.memh); st != C.UCS_OK {
		return nil, statusErr("ucp_mem_map", st)
	}
	return m, wk.packLocked(m)
}

// memAlloc has UCX allocate size bytes, filled with filler.
func (wk *worker) memAlloc(size int) (*memReg, error) {
	m := &memReg{}
	wk.mu.Lock()
	defer wk.mu.Unlock()
	var ptr unsafe.Pointer
	if st := C.px_mem_alloc(wk.ctx, C.size_t(size), &m.memh, &ptr); st != C.UCS_OK {
		return nil, statusErr("ucp_mem_map(allocate)", st)
	}
	m.base = uintptr(ptr)
	fill(unsafe.Slice((*byte)(ptr), size))
	return m, wk.packLocked(m)
}

// packLocked packs m's remote key; on failure it unmaps m. Call under mu.
func (wk *worker) packLocked(m *memReg) error {
	var buf unsafe.Pointer
	var n C.size_t
	if st := C.ucp_rkey_pack(wk.ctx, m.memh, &buf, &n); st != C.UCS_OK {
		C.ucp_mem_unmap(wk.ctx, m.memh)
		return statusErr("ucp_rkey_pack", st)
	}
	m.rkey = C.GoBytes(buf, C.int(n))
	C.ucp_rkey_buffer_release(buf)
	return nil
}

func (wk *worker) memUnmap(m *memReg) {
	wk.mu.Lock()
	C.ucp_mem_unmap(wk.ctx, m.memh)
	wk.mu.Unlock()
}

// endpoint is an endpoint to one agent's worker, with the remote keys
// unpacked on it (once per region: the packed key is the cache key).
type endpoint struct {
	wk *worker
	ep C.ucp_ep_h
	// peerErr: UCX detects the peer's failure on this endpoint.
	peerErr bool
	rkeys   map[string]C.ucp_rkey_h
	broken  bool
}

func (wk *worker) connect(addr []byte) (*endpoint, error) {
	if len(addr) == 0 {
		return nil, errors.New("ucp connect: empty worker address")
	}
	caddr := C.CBytes(addr)
	defer C.free(caddr)
	e := &endpoint{wk: wk, rkeys: map[string]C.ucp_rkey_h{}, peerErr: true}
	wk.mu.Lock()
	st := C.px_connect(wk.w, caddr, &e.ep)
	wk.mu.Unlock()
	if st != C.UCS_OK {
		return nil, statusErr("ucp_ep_create", st)
	}
	return e, nil
}

// connectLocal is connect without peer failure detection, for the worker
// limited to sysv and posix shared memory (localTLS); it reports
// errUnreachable when the agent is not on this host.
func (wk *worker) connectLocal(addr []byte) (*endpoint, error) {
	if len(addr) == 0 {
		return nil, errors.New("ucp connect: empty worker address")
	}
	caddr := C.CBytes(addr)
	defer C.free(caddr)
	e := &endpoint{wk: wk, rkeys: map[string]C.ucp_rkey_h{}}
	wk.mu.Lock()
	st := C.px_connect_local(wk.w, caddr, &e.ep)
	wk.mu.Unlock()
	if st == C.UCS_ERR_UNREACHABLE {
		return nil, errUnreachable
	}
	if st != C.UCS_OK {
		return nil, statusErr("ucp_ep_create", st)
	}
	return e, nil
}

// configuredTLS is the UCX_TLS in effect ("all" when none is set).
func configuredTLS() string {
	s := C.px_tls()
	if s == nil {
		return "all"
	}
	defer C.free(unsafe.Pointer(s))
	for line := range strings.Lines(C.GoString(s)) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "UCX_TLS="); ok {
			return v
		}
	}
	return "all"
}

// rkey returns packed's unpacked key on e (cached). Call under wk.mu.
func (e *endpoint) rkey(packed []byte) (C.ucp_rkey_h, error) {
	if rk, ok := e.rkeys[string(packed)]; ok {
		return rk, nil
	}
	if len(packed) == 0 {
		return nil, errors.New("ucp_ep_rkey_unpack: empty key")
	}
	var rk C.ucp_rkey_h
	if st := C.ucp_ep_rkey_unpack(e.ep, unsafe.Pointer(&packed[0]), &rk); st != C.UCS_OK {
		return nil, statusErr("ucp_ep_rkey_unpack", st)
	}
	e.rkeys[string(packed)] = rk
	return rk, nil
}

// info is ucp_ep_print_info's description of the endpoint: its lanes and
// the transport and device of each.
func (e *endpoint) info() string {
	e.wk.mu.Lock()
	defer e.wk.mu.Unlock()
	if e.broken {
		return ""
	}
	s := C.px_ep_info(e.ep)
	if s == nil {
		return ""
	}
	defer C.free(unsafe.Pointer(s))
	return C.GoString(s)
}

// getOp is one read: n bytes from raddr into the local address dst. It
// holds no Go pointer (a pull's thousands of ops cost the collector
// nothing); the caller keeps the destination alive until the get returns.
type getOp struct {
	dst   uintptr
	n     int
	raddr uint64
}

// opInto is the getOp reading len(b) bytes from raddr into b.
func opInto(b []byte, raddr uint64) getOp {
	return getOp{dst: uintptr(unsafe.Pointer(unsafe.SliceData(b))), n: len(b), raddr: raddr}
}

// cancelDrain bounds how long a cancelled get waits for its reads in
// flight before it force-closes the endpoint.
const cancelDrain = 2 * time.Second

// spinAfterWork is how long the progress loop keeps polling after the
// worker last had work, before it sleeps on the event file descriptor.
const spinAfterWork = 500 * time.Microsecond

// pumpSpins is how many progress calls one px_pump makes before it returns
// to Go to check for cancellation (a few microseconds of work).
const pumpSpins = 32

// get reads every op one-sided, at most window in flight, progressing the
// worker itself until they are all done. When cancelled() reports true it
// issues nothing more and lets the reads in flight finish (at most
// cancelDrain) before it returns: force-closing an endpoint with reads in
// flight makes UCX 1.13's software RMA (the tcp transport) abort the
// *serving* process with "Fatal: unexpected error: Endpoint timeout" in
// ucp_get_req_handler. A failed read breaks (closes) the endpoint.
//
// gone() reporting true (the agent found dead by other means, on an
// endpoint without peer failure detection) closes the endpoint at once:
// nothing in flight will complete, and no live agent can be hurt.
func (e *endpoint) get(packed []byte, ops []getOp, window int, cancelled, gone func() bool) error {
	n := len(ops)
	if n == 0 {
		return nil
	}
	// One C allocation holds the struct and its three arrays.
	size := C.sizeof_px_pull + C.size_t(n)*(C.sizeof_uintptr_t+C.sizeof_uint64_t+C.sizeof_size_t)
	mem := C.calloc(1, size)
	if mem == nil {
		return errors.New("ucp get: out of memory")
	}
	leaked := false
	defer func() {
		if !leaked {
			C.free(mem)
		}
	}()
	p := (*C.px_pull)(mem)
	dsts := unsafe.Slice((*C.uintptr_t)(unsafe.Add(mem, C.sizeof_px_pull)), n)
	raddrs := unsafe.Slice((*C.uint64_t)(unsafe.Add(unsafe.Pointer(&dsts[0]), n*C.sizeof_uintptr_t)), n)
	lens := unsafe.Slice((*C.size_t)(unsafe.Add(unsafe.Pointer(&raddrs[0]), n*C.sizeof_uint64_t)), n)
	for k, op := range ops {
		dsts[k] = C.uintptr_t(op.dst)
		raddrs[k] = C.uint64_t(op.raddr)
		lens[k] = C.size_t(op.n)
	}
	p.dst, p.raddr, p.len = &dsts[0], &raddrs[0], &lens[0]
	p.n, p.window = C.int(n), C.int(max(1, window))
	e.wk.pumping.Add(1)
	defer e.wk.pumping.Add(-1)

	e.wk.mu.Lock()
	if e.broken {
		e.wk.mu.Unlock()
		return errBroken
	}
	rk, err := e.rkey(packed)
	if err != nil {
		e.wk.mu.Unlock()
		return err
	}
	p.ep, p.rk = e.ep, rk
	var drainUntil time.Time
	peerGone := false
	for {
		over := C.px_pump(e.wk.w, p, pumpSpins) != 0
		if over {
			break
		}
		if p.stop != 0 && time.Now().After(drainUntil) {
			if e.broken && time.Now().After(drainUntil.Add(cancelDrain)) {
				// Closing the endpoint did not complete the gets in
				// flight: keep their state alive (leak it) rather than
				// let a late completion write freed memory.
				e.wk.mu.Unlock()
				leaked = true
				if peerGone {
					return errPeerGone
				}
				return errCancelled
			}
			e.breakLocked() // completes the gets in flight with an error
		}
		e.wk.mu.Unlock()
		switch {
		case p.stop == 0 && gone():
			p.stop = 1 // read by px_pump under mu
			drainUntil = time.Now()
			peerGone = true
		case p.stop == 0 && cancelled():
			p.stop = 1
			drainUntil = time.Now().Add(cancelDrain)
		}
		runtime.Gosched()
		e.wk.mu.Lock()
	}
	st := p.err
	stopped := p.stop != 0
	if st != C.UCS_OK {
		e.breakLocked()
	}
	e.wk.mu.Unlock()
	if peerGone {
		return errPeerGone
	}
	if st != C.UCS_OK && !stopped {
		return fmt.Errorf("%w: %w", errBroken, statusErr("ucp get", st))
	}
	if stopped {
		return errCancelled
	}
	return nil
}

func (e *endpoint) close() {
	e.wk.mu.Lock()
	defer e.wk.mu.Unlock()
	e.breakLocked()
}

func (e *endpoint) isBroken() bool {
	e.wk.mu.Lock()
	defer e.wk.mu.Unlock()
	return e.broken
}

// breakLocked destroys the remote keys and closes the endpoint, once.
// Call under wk.mu.
func (e *endpoint) breakLocked() {
	if e.broken {
		return
	}
	e.broken = true
	C.px_close_ep(e.wk.w, e.ep) // completes gets in flight with an error
	for _, rk := range e.rkeys {
		C.ucp_rkey_destroy(rk)
	}
	e.rkeys = nil
}

// probeRegion is C memory an agent serves to kv-probe: filler, never KV.
type probeRegion struct {
	mem  unsafe.Pointer
	size int
}

func newProbeRegion(size int) *probeRegion {
	mem := C.malloc(C.size_t(size))
	fill(unsafe.Slice((*byte)(mem), size))
	return &probeRegion{mem: mem, size: size}
}

// fill writes the probe regions' filler.
func fill(b []byte) {
	for i := range b {
		b[i] = byte(i*7 + 1)
	}
}

func (r *probeRegion) free() { C.free(r.mem) }

var (
	errBroken      = errors.New("ucx endpoint failed")
	errCancelled   = errors.New("ucx get cancelled")
	errUnreachable = errors.New("ucx: not reachable over these transports")
	errPeerGone    = errors.New("ucx get: the agent's control connection is gone, gets in flight abandoned")
)
