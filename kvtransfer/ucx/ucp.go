//go:build ucx

package ucx

/*
#cgo pkg-config: ucx
#include <ucp/api/ucp.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdlib.h>

// Connection requests arrive on the listener's callback during progress;
// they are queued here and accepted by the progress loop.
#define PX_QLEN 256
typedef struct { ucp_conn_request_h q[PX_QLEN]; int head, tail; } px_connq;

static void px_on_conn(ucp_conn_request_h req, void *arg) {
	px_connq *q = arg;
	int n = (q->tail + 1) % PX_QLEN;
	if (n == q->head) return; // full: the client times out and retries
	q->q[q->tail] = req;
	q->tail = n;
}

static ucp_conn_request_h px_next_conn(px_connq *q) {
	if (q->head == q->tail) return NULL;
	ucp_conn_request_h r = q->q[q->head];
	q->head = (q->head + 1) % PX_QLEN;
	return r;
}

static ucs_status_t px_init(ucp_context_h *ctx, ucp_worker_h *w) {
	ucp_config_t *cfg;
	ucs_status_t st = ucp_config_read(NULL, NULL, &cfg);
	if (st != UCS_OK) return st;
	ucp_params_t p;
	memset(&p, 0, sizeof p);
	p.field_mask = UCP_PARAM_FIELD_FEATURES;
	p.features = UCP_FEATURE_RMA;
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

static int px_sockaddr(const char *ip, int port, struct sockaddr_in *sa) {
	memset(sa, 0, sizeof *sa);
	sa->sin_family = AF_INET;
	sa->sin_port = htons(port);
	return inet_pton(AF_INET, ip, &sa->sin_addr) == 1 ? 0 : -1;
}

static ucs_status_t px_listen(ucp_worker_h w, const char *ip, px_connq *q, ucp_listener_h *l, int *port) {
	struct sockaddr_in sa;
	if (px_sockaddr(ip, 0, &sa)) return UCS_ERR_INVALID_PARAM;
	ucp_listener_params_t lp;
	memset(&lp, 0, sizeof lp);
	lp.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
	lp.sockaddr.addr = (const struct sockaddr *)&sa;
	lp.sockaddr.addrlen = sizeof sa;
	lp.conn_handler.cb = px_on_conn;
	lp.conn_handler.arg = q;
	ucs_status_t st = ucp_listener_create(w, &lp, l);
	if (st != UCS_OK) return st;
	ucp_listener_attr_t a;
	a.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
	st = ucp_listener_query(*l, &a);
	if (st != UCS_OK) return st;
	*port = ntohs(((struct sockaddr_in *)&a.sockaddr)->sin_port);
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

static ucs_status_t px_accept(ucp_worker_h w, ucp_conn_request_h r, ucp_ep_h *ep) {
	ucp_ep_params_t p;
	memset(&p, 0, sizeof p);
	p.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
		UCP_EP_PARAM_FIELD_ERR_HANDLER;
	p.conn_request = r;
	p.err_mode = UCP_ERR_HANDLING_MODE_PEER;
	p.err_handler.cb = px_on_ep_error;
	p.err_handler.arg = NULL;
	return ucp_ep_create(w, &p, ep);
}

static ucs_status_t px_connect(ucp_worker_h w, const char *ip, int port, ucp_ep_h *ep) {
	struct sockaddr_in sa;
	if (px_sockaddr(ip, port, &sa)) return UCS_ERR_INVALID_PARAM;
	ucp_ep_params_t p;
	memset(&p, 0, sizeof p);
	p.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
		UCP_EP_PARAM_FIELD_ERR_HANDLER;
	p.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
	p.sockaddr.addr = (const struct sockaddr *)&sa;
	p.sockaddr.addrlen = sizeof sa;
	p.err_mode = UCP_ERR_HANDLING_MODE_PEER;
	p.err_handler.cb = px_on_ep_error;
	p.err_handler.arg = NULL;
	return ucp_ep_create(w, &p, ep);
}

static ucs_status_t px_mem_map(ucp_context_h c, uintptr_t addr, size_t len, ucp_mem_h *m) {
	ucp_mem_map_params_t p;
	memset(&p, 0, sizeof p);
	p.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
	p.address = (void *)addr;
	p.length = len;
	return ucp_mem_map(c, &p, m);
}

// px_get starts a one-sided read; it returns NULL with *st set when the
// read completed (UCS_OK) or failed at once, else the request to poll.
static void *px_get(ucp_ep_h ep, uintptr_t dst, size_t len, uint64_t raddr, ucp_rkey_h rk, ucs_status_t *st) {
	ucp_request_param_t p;
	memset(&p, 0, sizeof p);
	ucs_status_ptr_t r = ucp_get_nbx(ep, (void *)dst, len, raddr, rk, &p);
	if (r == NULL) { *st = UCS_OK; return NULL; }
	if (UCS_PTR_IS_ERR(r)) { *st = UCS_PTR_STATUS(r); return NULL; }
	*st = UCS_INPROGRESS;
	return r;
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
*/
import "C"

import (
	"errors"
	"fmt"
	"sync"
	"time"
	"unsafe"
)

// statusErr names a UCS status.
func statusErr(op string, st C.ucs_status_t) error {
	return fmt.Errorf("%s: %s (%d)", op, C.GoString(C.ucs_status_string(st)), int(st))
}

// worker is one UCP context and worker, progressed by its own goroutine.
// Every UCP call on it is made under mu.
type worker struct {
	mu   sync.Mutex
	ctx  C.ucp_context_h
	w    C.ucp_worker_h
	q    *C.px_connq // listener connection queue (C memory)
	eps  []C.ucp_ep_h
	stop chan struct{}
	done chan struct{}
}

func newWorker() (*worker, error) {
	wk := &worker{stop: make(chan struct{}), done: make(chan struct{})}
	if st := C.px_init(&wk.ctx, &wk.w); st != C.UCS_OK {
		return nil, statusErr("ucp init", st)
	}
	wk.q = (*C.px_connq)(C.calloc(1, C.sizeof_px_connq))
	go wk.progressLoop()
	return wk, nil
}

// progressLoop progresses the worker and accepts queued connections,
// backing off while idle.
func (wk *worker) progressLoop() {
	defer close(wk.done)
	idle := 0
	for {
		select {
		case <-wk.stop:
			return
		default:
		}
		wk.mu.Lock()
		n := C.ucp_worker_progress(wk.w)
		for r := C.px_next_conn(wk.q); r != nil; r = C.px_next_conn(wk.q) {
			var ep C.ucp_ep_h
			if C.px_accept(wk.w, r, &ep) == C.UCS_OK {
				wk.eps = append(wk.eps, ep)
			}
			n++
		}
		wk.mu.Unlock()
		if n > 0 {
			idle = 0
			continue
		}
		idle++
		time.Sleep(time.Duration(min(idle, 20)) * 10 * time.Microsecond)
	}
}

func (wk *worker) close() {
	close(wk.stop)
	<-wk.done
	wk.mu.Lock()
	defer wk.mu.Unlock()
	for _, ep := range wk.eps {
		C.px_close_ep(wk.w, ep)
	}
	wk.eps = nil
	C.ucp_worker_destroy(wk.w)
	C.ucp_cleanup(wk.ctx)
	C.free(unsafe.Pointer(wk.q))
}

// listener is a UCP listener on the worker.
type listener struct {
	wk   *worker
	l    C.ucp_listener_h
	port int
}

func (wk *worker) listen(ip string) (*listener, error) {
	cip := C.CString(ip)
	defer C.free(unsafe.Pointer(cip))
	var l C.ucp_listener_h
	var port C.int
	wk.mu.Lock()
	st := C.px_listen(wk.w, cip, wk.q, &l, &port)
	wk.mu.Unlock()
	if st != C.UCS_OK {
		return nil, statusErr("ucp listen "+ip, st)
	}
	return &listener{wk: wk, l: l, port: int(port)}, nil
}

func (l *listener) close() {
	l.wk.mu.Lock()
	C.ucp_listener_destroy(l.l)
	l.wk.mu.Unlock()
}

// memReg is one registered region.
type memReg struct {
	memh C.ucp_mem_h
	base uintptr
	rkey []byte
}

func (wk *worker) memMap(mem []byte) (*memReg, error) {
	if len(mem) == 0 {
		return nil, errors.New("ucp mem map: empty region")
	}
	m := &memReg{base: uintptr(unsafe.Pointer(&mem[0]))}
	wk.mu.Lock()
	defer wk.mu.Unlock()
	if st := C.px_mem_map(wk.ctx, C.uintptr_t(m.base), C.size_t(len(mem)), &m.memh); st != C.UCS_OK {
		return nil, statusErr("ucp_mem_map", st)
	}
	var buf unsafe.Pointer
	var size C.size_t
	if st := C.ucp_rkey_pack(wk.ctx, m.memh, &buf, &size); st != C.UCS_OK {
		C.ucp_mem_unmap(wk.ctx, m.memh)
		return nil, statusErr("ucp_rkey_pack", st)
	}
	m.rkey = C.GoBytes(buf, C.int(size))
	C.ucp_rkey_buffer_release(buf)
	return m, nil
}

func (wk *worker) memUnmap(m *memReg) {
	wk.mu.Lock()
	C.ucp_mem_unmap(wk.ctx, m.memh)
	wk.mu.Unlock()
}

// endpoint is a client endpoint to one agent's UCP listener, with the
// remote keys unpacked on it.
type endpoint struct {
	wk     *worker
	ep     C.ucp_ep_h
	rkeys  map[string]C.ucp_rkey_h
	broken bool
}

func (wk *worker) connect(ip string, port int) (*endpoint, error) {
	cip := C.CString(ip)
	defer C.free(unsafe.Pointer(cip))
	e := &endpoint{wk: wk, rkeys: map[string]C.ucp_rkey_h{}}
	wk.mu.Lock()
	st := C.px_connect(wk.w, cip, C.int(port), &e.ep)
	wk.mu.Unlock()
	if st != C.UCS_OK {
		return nil, statusErr(fmt.Sprintf("ucp connect %s:%d", ip, port), st)
	}
	return e, nil
}

// rkey returns packed's unpacked key on e (cached). Call under wk.mu.
func (e *endpoint) rkey(packed []byte) (C.ucp_rkey_h, error) {
	if rk, ok := e.rkeys[string(packed)]; ok {
		return rk, nil
	}
	var rk C.ucp_rkey_h
	if st := C.ucp_ep_rkey_unpack(e.ep, unsafe.Pointer(&packed[0]), &rk); st != C.UCS_OK {
		return nil, statusErr("ucp_ep_rkey_unpack", st)
	}
	e.rkeys[string(packed)] = rk
	return rk, nil
}

// getOp is one block to read.
type getOp struct {
	dst   []byte
	raddr uint64
}

// cancelDrain bounds how long a cancelled get waits for its reads in
// flight before it force-closes the endpoint.
const cancelDrain = 2 * time.Second

// get reads every op one-sided and waits for all of them, polling until
// they complete or fail. When cancelled() reports true it issues nothing
// more and lets the reads in flight finish (at most cancelDrain) before it
// returns: force-closing an endpoint with reads in flight makes UCX 1.13's
// software RMA (the tcp transport) abort the *serving* process with
// "Fatal: unexpected error: Endpoint timeout" in ucp_get_req_handler. A
// failed read breaks (closes) the endpoint.
func (e *endpoint) get(packed []byte, ops []getOp, cancelled func() bool) error {
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
	reqs := make([]unsafe.Pointer, 0, len(ops))
	var first error
	for _, op := range ops {
		var st C.ucs_status_t
		r := C.px_get(e.ep, C.uintptr_t(uintptr(unsafe.Pointer(&op.dst[0]))), C.size_t(len(op.dst)), C.uint64_t(op.raddr), rk, &st)
		if r != nil {
			reqs = append(reqs, r)
		} else if st != C.UCS_OK {
			first = statusErr("ucp_get_nbx", st)
			break
		}
	}
	e.wk.mu.Unlock()
	var drainUntil time.Time
	for len(reqs) > 0 {
		if first == nil && cancelled() {
			first = errCancelled
			drainUntil = time.Now().Add(cancelDrain)
		}
		e.wk.mu.Lock()
		if first != nil && (!errors.Is(first, errCancelled) || time.Now().After(drainUntil)) {
			e.breakLocked()
		}
		kept := reqs[:0]
		for _, r := range reqs {
			st := C.ucp_request_check_status(r)
			if st == C.UCS_INPROGRESS {
				kept = append(kept, r)
				continue
			}
			if st != C.UCS_OK && first == nil {
				first = statusErr("ucp get", st)
			}
			C.ucp_request_free(r)
		}
		reqs = kept
		if first != nil && len(reqs) > 0 {
			C.ucp_worker_progress(e.wk.w)
		}
		e.wk.mu.Unlock()
		if len(reqs) > 0 {
			time.Sleep(5 * time.Microsecond)
		}
	}
	if first != nil && !errors.Is(first, errCancelled) {
		e.wk.mu.Lock()
		e.breakLocked()
		e.wk.mu.Unlock()
		return fmt.Errorf("%w: %w", errBroken, first)
	}
	return first
}

func (e *endpoint) close() {
	e.wk.mu.Lock()
	defer e.wk.mu.Unlock()
	e.breakLocked()
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

var (
	errBroken    = errors.New("ucx endpoint failed")
	errCancelled = errors.New("ucx get cancelled")
)
