// Package ucx is kvtransfer's ucx transport: our own thin cgo binding of
// the UCP API (context, worker, listener and client-server endpoints,
// ucp_mem_map, ucp_rkey_pack / ucp_ep_rkey_unpack and one-sided
// ucp_get_nbx, polled with ucp_request_check_status), over Debian's
// libucx-dev (UCX 1.13). It is compiled with -tags ucx; without the tag New
// returns kvtransfer.ErrUnsupported, so the default build needs no libucx.
package ucx
