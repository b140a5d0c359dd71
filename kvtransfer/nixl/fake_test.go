//go:build cgo

package nixl_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// fakeNIXL is a stand-in for libnixl_capi.so with the same nixl_capi_*
// symbols and prototypes (NIXL's src/bindings/rust/wrapper.h). Every agent
// lives in this one process, so a READ transfer is a memcpy from the
// remote agent's registered memory into the local agent's. It checks what
// real NIXL checks (registered memory on both sides, loaded remote
// metadata, matching lengths, a live remote agent) and, when FAKE_NIXL_LOG
// names a file, appends one line per call with its arguments.
// -DFAKE_OMIT_POST leaves nixl_capi_post_xfer_req out,
// -DFAKE_OMIT_CONFIGURED nixl_capi_create_configured_agent (as before NIXL
// 0.6.1); -DFAKE_STUB adds nixl_capi_is_stub returning true (NIXL's stub
// build). With FAKE_NIXL_STUCK set, transfers stay in progress forever.
const fakeNIXL = `
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int st_t;
enum { OK = 0, INPROG = 1, INVAL = -1, BACKEND = -2, INVSTATE = -3 };

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

typedef struct { uintptr_t addr; size_t len; uint64_t dev; } desc;
typedef struct { int mem; size_t n, cap; desc *d; } dlist;

static void push(dlist *l, desc d) {
	if (l->n == l->cap) {
		l->cap = l->cap ? 2 * l->cap : 8;
		l->d = realloc(l->d, l->cap * sizeof *l->d);
	}
	l->d[l->n++] = d;
}

#define MAXKNOWN 256
typedef struct agent {
	char name[256];
	bool alive;
	dlist regs;
	char *known[MAXKNOWN];
	struct agent *next;
} agent;
static agent *agents; // never freed: stale handles stay readable

typedef struct { void *backend; } optargs;

typedef struct {
	agent *a, *r;
	dlist l, rd;
	bool posted, done, released;
	int polls;
} xreq;

static void logf_(const char *fmt, ...) {
	const char *p = getenv("FAKE_NIXL_LOG");
	if (!p || !*p) return;
	FILE *f = fopen(p, "a");
	if (!f) return;
	va_list ap;
	va_start(ap, fmt);
	vfprintf(f, fmt, ap);
	va_end(ap);
	fputc('\n', f);
	fclose(f);
}

static void hex(const unsigned char *b, size_t n, char *out) {
	for (size_t i = 0; i < n; i++) sprintf(out + 2 * i, "%02x", b[i]);
	out[2 * n] = 0;
}

static agent *find(const char *name) {
	for (agent *a = agents; a; a = a->next)
		if (a->alive && strcmp(a->name, name) == 0) return a;
	return NULL;
}

static bool inside(const dlist *regs, desc d) {
	for (size_t i = 0; i < regs->n; i++)
		if (d.dev == regs->d[i].dev && d.addr >= regs->d[i].addr && d.addr + d.len <= regs->d[i].addr + regs->d[i].len) return true;
	return false;
}

static int knows(agent *a, const char *name) {
	for (int i = 0; i < MAXKNOWN; i++)
		if (a->known[i] && strcmp(a->known[i], name) == 0) return i;
	return -1;
}

st_t nixl_capi_create_agent(const char *name, agent **out) {
	if (!name || !out) return INVAL;
	pthread_mutex_lock(&mu);
	agent *a = calloc(1, sizeof *a);
	snprintf(a->name, sizeof a->name, "%s", name);
	a->alive = true;
	a->next = agents;
	agents = a;
	*out = a;
	logf_("create_agent name=%s", name);
	pthread_mutex_unlock(&mu);
	return OK;
}

#ifndef FAKE_OMIT_CONFIGURED
typedef struct {
	bool enable_prog_thread, enable_listen_thread;
	int listen_port, thread_sync;
	unsigned int num_workers;
	uint64_t pthr_delay_us, lthr_delay_us;
	bool capture_telemetry;
} agent_config;

st_t nixl_capi_create_configured_agent(const char *name, const agent_config *c, agent **out) {
	if (!name || !c || !out) return INVAL;
	logf_("create_configured_agent name=%s prog_thread=%d listen_thread=%d port=%d sync=%d workers=%u pthr_delay_us=%lu lthr_delay_us=%lu telemetry=%d",
		name, c->enable_prog_thread, c->enable_listen_thread, c->listen_port, c->thread_sync, c->num_workers,
		(unsigned long)c->pthr_delay_us, (unsigned long)c->lthr_delay_us, c->capture_telemetry);
	return nixl_capi_create_agent(name, out);
}
#endif

st_t nixl_capi_destroy_agent(agent *a) {
	if (!a) return INVAL;
	pthread_mutex_lock(&mu);
	a->alive = false;
	a->regs.n = 0;
	logf_("destroy_agent name=%s", a->name);
	pthread_mutex_unlock(&mu);
	return OK;
}

st_t nixl_capi_get_plugin_params(agent *a, const char *plugin, void **mems, void **params) {
	if (!a || !plugin || !mems || !params) return INVAL;
	logf_("get_plugin_params agent=%s plugin=%s", a->name, plugin);
	*mems = malloc(1);
	*params = malloc(1);
	return OK;
}
st_t nixl_capi_destroy_mem_list(void *m) { if (!m) return INVAL; free(m); logf_("destroy_mem_list"); return OK; }
st_t nixl_capi_destroy_params(void *p) { if (!p) return INVAL; free(p); logf_("destroy_params"); return OK; }

st_t nixl_capi_create_backend(agent *a, const char *plugin, void *params, void **b) {
	if (!a || !plugin || !params || !b) return INVAL;
	logf_("create_backend agent=%s plugin=%s", a->name, plugin);
	*b = malloc(1);
	return OK;
}
st_t nixl_capi_destroy_backend(void *b) { if (!b) return INVAL; free(b); logf_("destroy_backend"); return OK; }

st_t nixl_capi_create_opt_args(optargs **o) { if (!o) return INVAL; *o = calloc(1, sizeof **o); return OK; }
st_t nixl_capi_destroy_opt_args(optargs *o) { if (!o) return INVAL; free(o); return OK; }
st_t nixl_capi_opt_args_add_backend(optargs *o, void *b) { if (!o || !b) return INVAL; o->backend = b; return OK; }

static st_t new_dlist(int mem, dlist **out) {
	if (!out) return INVAL;
	*out = calloc(1, sizeof **out);
	(*out)->mem = mem;
	return OK;
}
static st_t free_dlist(dlist *l) { if (!l) return INVAL; free(l->d); free(l); return OK; }

st_t nixl_capi_create_reg_dlist(int mem, dlist **out, bool sorted) { (void)sorted; return new_dlist(mem, out); }
st_t nixl_capi_destroy_reg_dlist(dlist *l) { return free_dlist(l); }
st_t nixl_capi_reg_dlist_add_desc(dlist *l, uintptr_t addr, size_t len, uint64_t dev, const void *md, size_t mdlen) {
	(void)md; (void)mdlen;
	if (!l) return INVAL;
	push(l, (desc){addr, len, dev});
	return OK;
}
st_t nixl_capi_create_xfer_dlist(int mem, dlist **out, bool sorted) { (void)sorted; return new_dlist(mem, out); }
st_t nixl_capi_destroy_xfer_dlist(dlist *l) { return free_dlist(l); }
st_t nixl_capi_xfer_dlist_add_desc(dlist *l, uintptr_t addr, size_t len, uint64_t dev) {
	if (!l) return INVAL;
	push(l, (desc){addr, len, dev});
	return OK;
}

st_t nixl_capi_register_mem(agent *a, dlist *l, optargs *o) {
	if (!a || !l) return INVAL;
	if (!o || !o->backend) return INVAL; // the binding always names its backend
	pthread_mutex_lock(&mu);
	for (size_t i = 0; i < l->n; i++) {
		push(&a->regs, l->d[i]);
		logf_("register_mem agent=%s mem=%d addr=%#lx len=%zu dev=%lu", a->name, l->mem,
			(unsigned long)l->d[i].addr, l->d[i].len, (unsigned long)l->d[i].dev);
	}
	pthread_mutex_unlock(&mu);
	return OK;
}

st_t nixl_capi_deregister_mem(agent *a, dlist *l, optargs *o) {
	if (!a || !l || !o) return INVAL;
	pthread_mutex_lock(&mu);
	st_t st = OK;
	for (size_t i = 0; i < l->n; i++) {
		size_t j = 0;
		while (j < a->regs.n && !(a->regs.d[j].addr == l->d[i].addr && a->regs.d[j].len == l->d[i].len)) j++;
		if (j == a->regs.n) { st = a->alive ? INVAL : OK; continue; }
		a->regs.d[j] = a->regs.d[--a->regs.n];
		logf_("deregister_mem agent=%s addr=%#lx len=%zu", a->name, (unsigned long)l->d[i].addr, l->d[i].len);
	}
	pthread_mutex_unlock(&mu);
	return st;
}

// Metadata: "FAKEMD", a NUL, the agent name, 0xff (binary on purpose).
st_t nixl_capi_get_local_md(agent *a, void **data, size_t *len) {
	if (!a || !data || !len) return INVAL;
	size_t n = strlen(a->name);
	unsigned char *b = malloc(7 + n + 1);
	memcpy(b, "FAKEMD", 7);
	memcpy(b + 7, a->name, n);
	b[7 + n] = 0xff;
	*data = b;
	*len = 8 + n;
	char h[2 * 300 + 1];
	hex(b, *len, h);
	logf_("get_local_md agent=%s md=%s", a->name, h);
	return OK;
}

st_t nixl_capi_load_remote_md(agent *a, const void *data, size_t len, char **name) {
	if (!a || !data || !len || !name) return INVAL;
	const unsigned char *b = data;
	char h[2 * 300 + 1];
	if (len > 300 || len < 9 || memcmp(b, "FAKEMD", 7) != 0 || b[len - 1] != 0xff) return BACKEND;
	hex(b, len, h);
	char nm[300];
	memcpy(nm, b + 7, len - 8);
	nm[len - 8] = 0;
	pthread_mutex_lock(&mu);
	if (knows(a, nm) < 0)
		for (int i = 0; i < MAXKNOWN; i++)
			if (!a->known[i]) { a->known[i] = strdup(nm); break; }
	logf_("load_remote_md agent=%s md=%s name=%s", a->name, h, nm);
	pthread_mutex_unlock(&mu);
	*name = strdup(nm);
	return OK;
}

st_t nixl_capi_invalidate_remote_md(agent *a, const char *name) {
	if (!a || !name) return INVAL;
	pthread_mutex_lock(&mu);
	int i = knows(a, name);
	if (i >= 0) { free(a->known[i]); a->known[i] = NULL; }
	logf_("invalidate_remote_md agent=%s name=%s", a->name, name);
	pthread_mutex_unlock(&mu);
	return i >= 0 ? OK : BACKEND;
}

static void copy_list(dlist *to, const dlist *from) {
	to->mem = from->mem;
	for (size_t i = 0; i < from->n; i++) push(to, from->d[i]);
}

st_t nixl_capi_create_xfer_req(agent *a, int op, dlist *l, dlist *r, const char *remote, xreq **out, optargs *o) {
	if (!a || !l || !r || !remote || !out) return INVAL;
	if (!o || !o->backend) return INVAL;
	pthread_mutex_lock(&mu);
	st_t st = OK;
	logf_("create_xfer_req agent=%s op=%d remote=%s n=%zu local_mem=%d remote_mem=%d", a->name, op, remote, l->n, l->mem, r->mem);
	for (size_t i = 0; i < l->n && i < r->n; i++)
		logf_("xfer_desc i=%zu local=%#lx/%zu/%lu remote=%#lx/%zu/%lu", i,
			(unsigned long)l->d[i].addr, l->d[i].len, (unsigned long)l->d[i].dev,
			(unsigned long)r->d[i].addr, r->d[i].len, (unsigned long)r->d[i].dev);
	agent *ra = find(remote);
	if (op != 0 || l->n != r->n || l->n == 0) st = INVAL;
	else if (knows(a, remote) < 0 || !ra) st = BACKEND;
	for (size_t i = 0; st == OK && i < l->n; i++)
		if (l->d[i].len != r->d[i].len || !inside(&a->regs, l->d[i]) || !inside(&ra->regs, r->d[i])) st = BACKEND;
	if (st == OK) {
		xreq *x = calloc(1, sizeof *x);
		x->a = a;
		x->r = ra;
		copy_list(&x->l, l);
		copy_list(&x->rd, r);
		*out = x;
	}
	logf_("create_xfer_req -> %d", st);
	pthread_mutex_unlock(&mu);
	return st;
}

#ifndef FAKE_OMIT_POST
st_t nixl_capi_post_xfer_req(agent *a, xreq *x, optargs *o) {
	if (!a || !x) return INVAL;
	(void)o;
	pthread_mutex_lock(&mu);
	st_t st = x->r->alive ? INPROG : BACKEND;
	if (st == INPROG) x->posted = true;
	logf_("post_xfer_req agent=%s -> %d", a->name, st);
	pthread_mutex_unlock(&mu);
	return st;
}
#endif

// The first poll moves the bytes and still says in progress; the second
// says done, so the binding's polling loop is exercised.
st_t nixl_capi_get_xfer_status(agent *a, xreq *x) {
	if (!a || !x || !x->posted) return INVAL;
	pthread_mutex_lock(&mu);
	st_t st;
	const char *stuck = getenv("FAKE_NIXL_STUCK");
	if (x->done) st = OK;
	else if (!x->r->alive) st = BACKEND;
	else if (stuck && *stuck) st = INPROG; // a transfer that never ends
	else if (x->polls++ == 0) {
		for (size_t i = 0; i < x->l.n; i++)
			memcpy((void *)x->l.d[i].addr, (const void *)x->rd.d[i].addr, x->l.d[i].len);
		st = INPROG;
	} else {
		x->done = true;
		st = OK;
	}
	pthread_mutex_unlock(&mu);
	return st;
}

st_t nixl_capi_release_xfer_req(agent *a, xreq *x) {
	if (!a || !x || x->released) return INVAL;
	x->released = true;
	logf_("release_xfer_req agent=%s done=%d", a->name, x->done);
	return OK;
}

st_t nixl_capi_destroy_xfer_req(xreq *x) {
	if (!x) return INVAL;
	if (!x->released) return INVSTATE;
	free(x->l.d);
	free(x->rd.d);
	free(x);
	logf_("destroy_xfer_req");
	return OK;
}

#ifdef FAKE_STUB
bool nixl_capi_is_stub(void) { return true; }
#else
bool nixl_capi_is_stub(void) { return false; }
#endif
`

// buildFake compiles the fake library with the C compiler into a temporary
// directory and returns its path.
func buildFake(t testing.TB, defines ...string) string {
	t.Helper()
	dir := t.TempDir()
	src := filepath.Join(dir, "fake_nixl_capi.c")
	lib := filepath.Join(dir, "libfake_nixl_capi.so")
	require.NoError(t, os.WriteFile(src, []byte(fakeNIXL), 0o600))
	cc := "cc"
	if v := os.Getenv("CC"); v != "" {
		cc = v
	}
	args := append([]string{"-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-o", lib, src, "-lpthread"}, defines...)
	out, err := exec.Command(cc, args...).CombinedOutput()
	require.NoError(t, err, "building the fake NIXL library: %s", out)
	return lib
}
