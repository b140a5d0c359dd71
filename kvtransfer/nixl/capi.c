//go:build cgo

// The dlopen binding of NIXL's C API: the symbol table and one trampoline
// per nixl_capi_* function we call (declared in capi.h).
#include <dlfcn.h>
#include <stdlib.h>

#include "capi.h"

static const char *nx_names[NX_NUM] = {
	"nixl_capi_create_agent", "nixl_capi_destroy_agent",
	"nixl_capi_get_plugin_params", "nixl_capi_destroy_mem_list", "nixl_capi_destroy_params",
	"nixl_capi_create_backend", "nixl_capi_destroy_backend",
	"nixl_capi_create_opt_args", "nixl_capi_destroy_opt_args", "nixl_capi_opt_args_add_backend",
	"nixl_capi_create_reg_dlist", "nixl_capi_destroy_reg_dlist", "nixl_capi_reg_dlist_add_desc",
	"nixl_capi_register_mem", "nixl_capi_deregister_mem",
	"nixl_capi_get_local_md", "nixl_capi_load_remote_md", "nixl_capi_invalidate_remote_md",
	"nixl_capi_create_xfer_dlist", "nixl_capi_destroy_xfer_dlist", "nixl_capi_xfer_dlist_add_desc",
	"nixl_capi_create_xfer_req", "nixl_capi_post_xfer_req", "nixl_capi_get_xfer_status",
	"nixl_capi_release_xfer_req", "nixl_capi_destroy_xfer_req",
};

const char *nx_name(int i) { return i >= 0 && i < NX_NUM ? nx_names[i] : "?"; }

// nx_open dlopens path and resolves every symbol. It returns 0, or -1 when
// dlopen failed (*why = dlerror()), or i+1 when symbol i is missing.
int nx_open(const char *path, nx_lib *l, char **why) {
	dlerror();
	l->h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!l->h) {
		const char *e = dlerror();
		*why = (char *)(e ? e : "dlopen failed");
		return -1;
	}
	for (int i = 0; i < NX_NUM; i++) {
		l->fn[i] = dlsym(l->h, nx_names[i]);
		if (!l->fn[i]) {
			dlclose(l->h);
			l->h = NULL;
			return i + 1;
		}
	}
	l->is_stub = (bool (*)(void))dlsym(l->h, "nixl_capi_is_stub");
	l->create_configured_agent = (nx_status (*)(const char *, const nx_agent_config *, void **))dlsym(l->h, "nixl_capi_create_configured_agent");
	return 0;
}

bool nx_is_stub(nx_lib *l) { return l->is_stub && l->is_stub(); }
bool nx_has_configured_agent(nx_lib *l) { return l->create_configured_agent != NULL; }

#define NXF(i, T) ((T)l->fn[i])

// Trampolines: one per C function, calling through the table.
// nx_create_agent creates an agent with NIXL's progress thread, whose poll
// timeout is pthr_delay_us (NIXL rounds it up to whole milliseconds).
// nixl_capi_create_agent passes NIXL's default delay, 0: the thread then
// polls without sleeping and keeps a core busy even when idle. Libraries
// without nixl_capi_create_configured_agent (before 0.6.1) get that.
nx_status nx_create_agent(nx_lib *l, const char *name, uint64_t pthr_delay_us, void **a) {
	if (l->create_configured_agent) {
		nx_agent_config c = {
			.enable_prog_thread = true,
			.enable_listen_thread = false,
			.listen_port = 0,
			.thread_sync = 0, // NIXL_CAPI_THREAD_SYNC_DEFAULT: calls are serialised by the binding
			.num_workers = 1,
			.pthr_delay_us = pthr_delay_us,
			.lthr_delay_us = 100000, // nixlAgentConfig's default
			.capture_telemetry = false,
		};
		return l->create_configured_agent(name, &c, a);
	}
	return NXF(NX_CREATE_AGENT, nx_status (*)(const char *, void **))(name, a);
}
nx_status nx_destroy_agent(nx_lib *l, void *a) {
	return NXF(NX_DESTROY_AGENT, nx_status (*)(void *))(a);
}
nx_status nx_get_plugin_params(nx_lib *l, void *a, const char *plugin, void **mems, void **params) {
	return NXF(NX_GET_PLUGIN_PARAMS, nx_status (*)(void *, const char *, void **, void **))(a, plugin, mems, params);
}
nx_status nx_destroy_mem_list(nx_lib *l, void *m) {
	return NXF(NX_DESTROY_MEM_LIST, nx_status (*)(void *))(m);
}
nx_status nx_destroy_params(nx_lib *l, void *p) {
	return NXF(NX_DESTROY_PARAMS, nx_status (*)(void *))(p);
}
nx_status nx_create_backend(nx_lib *l, void *a, const char *plugin, void *params, void **b) {
	return NXF(NX_CREATE_BACKEND, nx_status (*)(void *, const char *, void *, void **))(a, plugin, params, b);
}
nx_status nx_destroy_backend(nx_lib *l, void *b) {
	return NXF(NX_DESTROY_BACKEND, nx_status (*)(void *))(b);
}
nx_status nx_create_opt_args(nx_lib *l, void **o) {
	return NXF(NX_CREATE_OPT_ARGS, nx_status (*)(void **))(o);
}
nx_status nx_destroy_opt_args(nx_lib *l, void *o) {
	return NXF(NX_DESTROY_OPT_ARGS, nx_status (*)(void *))(o);
}
nx_status nx_opt_args_add_backend(nx_lib *l, void *o, void *b) {
	return NXF(NX_OPT_ARGS_ADD_BACKEND, nx_status (*)(void *, void *))(o, b);
}
nx_status nx_register_mem(nx_lib *l, void *a, void *dl, void *o) {
	return NXF(NX_REGISTER_MEM, nx_status (*)(void *, void *, void *))(a, dl, o);
}
nx_status nx_deregister_mem(nx_lib *l, void *a, void *dl, void *o) {
	return NXF(NX_DEREGISTER_MEM, nx_status (*)(void *, void *, void *))(a, dl, o);
}
nx_status nx_get_local_md(nx_lib *l, void *a, void **data, size_t *len) {
	return NXF(NX_GET_LOCAL_MD, nx_status (*)(void *, void **, size_t *))(a, data, len);
}
nx_status nx_load_remote_md(nx_lib *l, void *a, const void *data, size_t len, char **name) {
	return NXF(NX_LOAD_REMOTE_MD, nx_status (*)(void *, const void *, size_t, char **))(a, data, len, name);
}
nx_status nx_invalidate_remote_md(nx_lib *l, void *a, const char *name) {
	return NXF(NX_INVALIDATE_REMOTE_MD, nx_status (*)(void *, const char *))(a, name);
}
nx_status nx_create_xfer_req(nx_lib *l, void *a, int op, void *local, void *remote, const char *remote_agent, void **req, void *o) {
	return NXF(NX_CREATE_XFER_REQ, nx_status (*)(void *, int, void *, void *, const char *, void **, void *))(a, op, local, remote, remote_agent, req, o);
}
nx_status nx_post_xfer_req(nx_lib *l, void *a, void *req, void *o) {
	return NXF(NX_POST_XFER_REQ, nx_status (*)(void *, void *, void *))(a, req, o);
}
nx_status nx_get_xfer_status(nx_lib *l, void *a, void *req) {
	return NXF(NX_GET_XFER_STATUS, nx_status (*)(void *, void *))(a, req);
}
nx_status nx_release_xfer_req(nx_lib *l, void *a, void *req) {
	return NXF(NX_RELEASE_XFER_REQ, nx_status (*)(void *, void *))(a, req);
}
nx_status nx_destroy_xfer_req(nx_lib *l, void *req) {
	return NXF(NX_DESTROY_XFER_REQ, nx_status (*)(void *))(req);
}

// nx_reg_dlist and nx_xfer_dlist build a descriptor list of n descriptors
// in one call; on error *fn names the failing function. The create
// functions are called with the trailing `bool sorted` (false) of older
// wrapper.h versions; newer ones take two arguments and ignore the third
// (register-passed on x86-64 and arm64), so one binary serves both.
// reg_dlist_add_desc gets the (metadata, metadata_len) pair of current
// wrapper.h as (NULL, 0) for the same reason.
nx_status nx_reg_dlist(nx_lib *l, int mem, const nx_desc *d, size_t n, void **out, int *fn) {
	void *dl = NULL;
	*fn = NX_CREATE_REG_DLIST;
	nx_status st = NXF(NX_CREATE_REG_DLIST, nx_status (*)(int, void **, bool))(mem, &dl, false);
	if (st != 0) return st;
	*fn = NX_REG_DLIST_ADD_DESC;
	for (size_t i = 0; i < n; i++) {
		st = NXF(NX_REG_DLIST_ADD_DESC, nx_status (*)(void *, uintptr_t, size_t, uint64_t, const void *, size_t))(dl, d[i].addr, d[i].len, d[i].dev, NULL, 0);
		if (st != 0) {
			NXF(NX_DESTROY_REG_DLIST, nx_status (*)(void *))(dl);
			return st;
		}
	}
	*out = dl;
	return 0;
}
nx_status nx_destroy_reg_dlist(nx_lib *l, void *dl) {
	return NXF(NX_DESTROY_REG_DLIST, nx_status (*)(void *))(dl);
}
nx_status nx_xfer_dlist(nx_lib *l, int mem, const nx_desc *d, size_t n, void **out, int *fn) {
	void *dl = NULL;
	*fn = NX_CREATE_XFER_DLIST;
	nx_status st = NXF(NX_CREATE_XFER_DLIST, nx_status (*)(int, void **, bool))(mem, &dl, false);
	if (st != 0) return st;
	*fn = NX_XFER_DLIST_ADD_DESC;
	for (size_t i = 0; i < n; i++) {
		st = NXF(NX_XFER_DLIST_ADD_DESC, nx_status (*)(void *, uintptr_t, size_t, uint64_t))(dl, d[i].addr, d[i].len, d[i].dev);
		if (st != 0) {
			NXF(NX_DESTROY_XFER_DLIST, nx_status (*)(void *))(dl);
			return st;
		}
	}
	*out = dl;
	return 0;
}
nx_status nx_destroy_xfer_dlist(nx_lib *l, void *dl) {
	return NXF(NX_DESTROY_XFER_DLIST, nx_status (*)(void *))(dl);
}
