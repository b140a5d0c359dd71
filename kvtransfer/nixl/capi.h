// Declarations shared by the cgo files of package nixl; capi.c defines
// them. The nixl_capi_* functions we call have the prototypes of NIXL's
// src/bindings/rust/wrapper.h (see docs/kvtransfer.md, "NIXL binding").
// nixl_capi_status_t and the enums are int-sized; every handle is an opaque
// pointer. No NIXL header is included: the library is dlopen'ed.
#ifndef PD_SIDECAR_NIXL_CAPI_H
#define PD_SIDECAR_NIXL_CAPI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef int nx_status;

enum {
	NX_CREATE_AGENT, NX_DESTROY_AGENT,
	NX_GET_PLUGIN_PARAMS, NX_DESTROY_MEM_LIST, NX_DESTROY_PARAMS,
	NX_CREATE_BACKEND, NX_DESTROY_BACKEND,
	NX_CREATE_OPT_ARGS, NX_DESTROY_OPT_ARGS, NX_OPT_ARGS_ADD_BACKEND,
	NX_CREATE_REG_DLIST, NX_DESTROY_REG_DLIST, NX_REG_DLIST_ADD_DESC,
	NX_REGISTER_MEM, NX_DEREGISTER_MEM,
	NX_GET_LOCAL_MD, NX_LOAD_REMOTE_MD, NX_INVALIDATE_REMOTE_MD,
	NX_CREATE_XFER_DLIST, NX_DESTROY_XFER_DLIST, NX_XFER_DLIST_ADD_DESC,
	NX_CREATE_XFER_REQ, NX_POST_XFER_REQ, NX_GET_XFER_STATUS,
	NX_RELEASE_XFER_REQ, NX_DESTROY_XFER_REQ,
	NX_NUM
};

// nx_agent_config mirrors nixl_capi_agent_config_t (wrapper.h since NIXL
// 0.6.1; the thread-sync enum is int-sized).
typedef struct {
	bool enable_prog_thread;
	bool enable_listen_thread;
	int listen_port;
	int thread_sync;
	unsigned int num_workers;
	uint64_t pthr_delay_us;
	uint64_t lthr_delay_us;
	bool capture_telemetry;
} nx_agent_config;

// nx_lib is one loaded library: its handle and its function table.
typedef struct nx_lib {
	void *h;
	void *fn[NX_NUM];
	bool (*is_stub)(void); // optional: nixl_capi_is_stub of NIXL's stub build
	// optional: nixl_capi_create_configured_agent (NIXL 0.6.1 and later)
	nx_status (*create_configured_agent)(const char *, const nx_agent_config *, void **);
} nx_lib;

// nx_desc mirrors Desc.
typedef struct { uintptr_t addr; size_t len; uint64_t dev; } nx_desc;

const char *nx_name(int i);
int nx_open(const char *path, nx_lib *l, char **why);
bool nx_is_stub(nx_lib *l);
bool nx_has_configured_agent(nx_lib *l);

nx_status nx_create_agent(nx_lib *l, const char *name, uint64_t pthr_delay_us, void **a);
nx_status nx_destroy_agent(nx_lib *l, void *a);
nx_status nx_get_plugin_params(nx_lib *l, void *a, const char *plugin, void **mems, void **params);
nx_status nx_destroy_mem_list(nx_lib *l, void *m);
nx_status nx_destroy_params(nx_lib *l, void *p);
nx_status nx_create_backend(nx_lib *l, void *a, const char *plugin, void *params, void **b);
nx_status nx_destroy_backend(nx_lib *l, void *b);
nx_status nx_create_opt_args(nx_lib *l, void **o);
nx_status nx_destroy_opt_args(nx_lib *l, void *o);
nx_status nx_opt_args_add_backend(nx_lib *l, void *o, void *b);
nx_status nx_register_mem(nx_lib *l, void *a, void *dl, void *o);
nx_status nx_deregister_mem(nx_lib *l, void *a, void *dl, void *o);
nx_status nx_get_local_md(nx_lib *l, void *a, void **data, size_t *len);
nx_status nx_load_remote_md(nx_lib *l, void *a, const void *data, size_t len, char **name);
nx_status nx_invalidate_remote_md(nx_lib *l, void *a, const char *name);
nx_status nx_create_xfer_req(nx_lib *l, void *a, int op, void *local, void *remote, const char *remote_agent, void **req, void *o);
nx_status nx_post_xfer_req(nx_lib *l, void *a, void *req, void *o);
nx_status nx_get_xfer_status(nx_lib *l, void *a, void *req);
nx_status nx_release_xfer_req(nx_lib *l, void *a, void *req);
nx_status nx_destroy_xfer_req(nx_lib *l, void *req);
nx_status nx_reg_dlist(nx_lib *l, int mem, const nx_desc *d, size_t n, void **out, int *fn);
nx_status nx_destroy_reg_dlist(nx_lib *l, void *dl);
nx_status nx_xfer_dlist(nx_lib *l, int mem, const nx_desc *d, size_t n, void **out, int *fn);
nx_status nx_destroy_xfer_dlist(nx_lib *l, void *dl);

#endif
