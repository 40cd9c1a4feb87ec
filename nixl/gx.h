// gx.h: gonixl's own declaration of NIXL's C API (libnixl_capi.so, the nixl_capi_* functions of NIXL's
// src/bindings/rust/wrapper.h) as function-pointer slots resolved with dlopen/dlsym at run time, plus the
// batch helpers gonixl calls through cgo. No NIXL header is needed to build.
#ifndef GONIXL_GX_H
#define GONIXL_GX_H
#include <stdio.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

// Prototypes of NIXL's C API (libnixl_capi.so, the nixl_capi_* functions of NIXL's
// src/bindings/rust/wrapper.h), declared here by gonixl as function-pointer types so that the module builds
// with no NIXL installed. The handles are opaque pointers.
typedef int gx_status;
typedef void* gx_h;

typedef struct {
	bool enable_prog_thread;
	bool enable_listen_thread;
	int listen_port;
	int thread_sync;
	unsigned int num_workers;
	uint64_t pthr_delay_us;
	uint64_t lthr_delay_us;
	bool capture_telemetry;
} gx_agent_config;

typedef struct {
	uint64_t start_time_us;
	uint64_t post_duration_us;
	uint64_t xfer_duration_us;
	uint64_t total_bytes;
	uint64_t desc_count;
} gx_telemetry;

// One slot per C API function gonixl uses; required ones must resolve at load time.
typedef struct {
	gx_status (*create_configured_agent)(const char*, const gx_agent_config*, gx_h*);
	gx_status (*destroy_agent)(gx_h);
	gx_status (*get_local_md)(gx_h, void**, size_t*);
	gx_status (*get_local_partial_md)(gx_h, gx_h, void**, size_t*, gx_h);
	gx_status (*load_remote_md)(gx_h, const void*, size_t, char**);
	gx_status (*invalidate_remote_md)(gx_h, const char*);
	gx_status (*check_remote_md)(gx_h, const char*, gx_h);
	gx_status (*get_available_plugins)(gx_h, gx_h*);
	gx_status (*destroy_string_list)(gx_h);
	gx_status (*string_list_size)(gx_h, size_t*);
	gx_status (*string_list_get)(gx_h, size_t, const char**);
	gx_status (*get_plugin_params)(gx_h, const char*, gx_h*, gx_h*);
	gx_status (*destroy_mem_list)(gx_h);
	gx_status (*destroy_params)(gx_h);
	gx_status (*create_backend)(gx_h, const char*, gx_h, gx_h*);
	gx_status (*destroy_backend)(gx_h);
	gx_status (*get_backend_params)(gx_h, gx_h, gx_h*, gx_h*);
	gx_status (*create_opt_args)(gx_h*);
	gx_status (*destroy_opt_args)(gx_h);
	gx_status (*opt_args_add_backend)(gx_h, gx_h);
	gx_status (*opt_args_set_notif_msg)(gx_h, const void*, size_t);
	gx_status (*opt_args_set_has_notif)(gx_h, bool);
	gx_status (*create_params)(gx_h*);
	gx_status (*params_add)(gx_h, const char*, const char*);
	gx_status (*params_is_empty)(gx_h, bool*);
	gx_status (*params_create_iterator)(gx_h, gx_h*);
	gx_status (*params_iterator_next)(gx_h, const char**, const char**, bool*);
	gx_status (*params_destroy_iterator)(gx_h);
	gx_status (*mem_list_size)(gx_h, size_t*);
	gx_status (*mem_list_get)(gx_h, size_t, int*);
	gx_status (*register_mem)(gx_h, gx_h, gx_h);
	gx_status (*deregister_mem)(gx_h, gx_h, gx_h);
	gx_status (*make_connection)(gx_h, const char*, gx_h);
	gx_status (*prep_xfer_dlist)(gx_h, const char*, gx_h, gx_h*, gx_h);
	gx_status (*release_xfer_dlist_handle)(gx_h, gx_h);
	gx_status (*make_xfer_req)(gx_h, int, gx_h, const int*, size_t, gx_h, const int*, size_t, gx_h*, gx_h);
	gx_status (*create_xfer_req)(gx_h, int, gx_h, gx_h, const char*, gx_h*, gx_h);
	gx_status (*estimate_xfer_cost)(gx_h, gx_h, gx_h, int64_t*, int64_t*, int*);
	gx_status (*post_xfer_req)(gx_h, gx_h, gx_h);
	gx_status (*get_xfer_status)(gx_h, gx_h);
	gx_status (*query_xfer_backend)(gx_h, gx_h, gx_h*);
	gx_status (*release_xfer_req)(gx_h, gx_h);
	gx_status (*destroy_xfer_req)(gx_h);
	gx_status (*get_xfer_telemetry)(gx_h, gx_h, gx_telemetry*);
	gx_status (*get_notifs)(gx_h, gx_h, gx_h);
	gx_status (*create_notif_map)(gx_h*);
	gx_status (*destroy_notif_map)(gx_h);
	gx_status (*notif_map_size)(gx_h, size_t*);
	gx_status (*notif_map_get_agent_at)(gx_h, size_t, const char**);
	gx_status (*notif_map_get_notifs_size)(gx_h, const char*, size_t*);
	gx_status (*notif_map_get_notif)(gx_h, const char*, size_t, const void**, size_t*);
	gx_status (*notif_map_clear)(gx_h);
	gx_status (*gen_notif)(gx_h, const char*, const void*, size_t, gx_h);
	gx_status (*create_xfer_dlist)(int, gx_h*);
	gx_status (*destroy_xfer_dlist)(gx_h);
	gx_status (*xfer_dlist_add_desc)(gx_h, uintptr_t, size_t, uint64_t);
	gx_status (*create_reg_dlist)(int, gx_h*);
	gx_status (*destroy_reg_dlist)(gx_h);
	gx_status (*reg_dlist_add_desc)(gx_h, uintptr_t, size_t, uint64_t, const void*, size_t);
	gx_status (*create_query_resp_list)(gx_h*);
	gx_status (*destroy_query_resp_list)(gx_h);
	gx_status (*query_resp_list_size)(gx_h, size_t*);
	gx_status (*query_resp_list_has_value)(gx_h, size_t, bool*);
	gx_status (*query_resp_list_get_params)(gx_h, size_t, gx_h*);
	gx_status (*query_mem)(gx_h, gx_h, gx_h, gx_h);
	bool (*is_stub)(void);
	// Optional (newer NIXL): probed at load time, NULL when absent.
	gx_status (*opt_args_set_custom_param)(gx_h, const void*, size_t);
	gx_status (*opt_args_set_skip_desc_merge)(gx_h, bool);
} gx_api_t;


extern gx_api_t gx_api;
int gx_open(const char* path, char* err, size_t errlen);
int gx_preload(const char* path, char* err, size_t errlen);
int gx_has_custom_param(void);
int gx_has_skip_desc_merge(void);
gx_status gx_create_agent(const char* name, const gx_agent_config* cfg, gx_h* out);
gx_status gx_destroy_agent(gx_h a);
gx_status gx_get_local_md(gx_h a, void** d, size_t* n);
gx_status gx_get_local_partial_md(gx_h a, gx_h l, void** d, size_t* n, gx_h o);
gx_status gx_load_remote_md(gx_h a, const void* d, size_t n, char** name);
gx_status gx_invalidate_remote_md(gx_h a, const char* n);
gx_status gx_check_remote_md(gx_h a, const char* n, gx_h l);
gx_status gx_create_backend(gx_h a, const char* p, gx_h params, gx_h* out);
gx_status gx_destroy_backend(gx_h b);
gx_status gx_create_opt_args(gx_h* o);
gx_status gx_destroy_opt_args(gx_h o);
gx_status gx_opt_args_add_backend(gx_h o, gx_h b);
gx_status gx_opt_args_set_notif(gx_h o, const void* d, size_t n);
gx_status gx_opt_args_set_custom_param(gx_h o, const void* d, size_t n);
gx_status gx_create_params(gx_h* p);
gx_status gx_params_add(gx_h p, const char* k, const char* v);
gx_status gx_destroy_params(gx_h p);
gx_status gx_register_mem(gx_h a, gx_h l, gx_h o);
gx_status gx_deregister_mem(gx_h a, gx_h l, gx_h o);
gx_status gx_make_connection(gx_h a, const char* r, gx_h o);
gx_status gx_prep_xfer_dlist(gx_h a, const char* n, gx_h l, gx_h* out, gx_h o);
gx_status gx_release_xfer_dlist_handle(gx_h a, gx_h d);
gx_status gx_make_xfer_req(gx_h a, int op, gx_h l, const int* li, size_t ln, gx_h r, const int* ri, size_t rn, gx_h* out, gx_h o);
gx_status gx_create_xfer_req(gx_h a, int op, gx_h l, gx_h r, const char* n, gx_h* out, gx_h o);
gx_status gx_estimate_xfer_cost(gx_h a, gx_h x, gx_h o, int64_t* d, int64_t* e, int* m);
gx_status gx_post_xfer_req(gx_h a, gx_h x, gx_h o);
gx_status gx_get_xfer_status(gx_h a, gx_h x);
gx_status gx_get_xfer_telemetry(gx_h a, gx_h x, gx_telemetry* t);
gx_status gx_gen_notif(gx_h a, const char* r, const void* d, size_t n, gx_h o);
gx_status gx_release_xfer(gx_h a, gx_h x);
gx_status gx_query_xfer_backend(gx_h a, gx_h x, void** inner);
void* gx_backend_inner(gx_h b);
gx_status gx_xfer_dlist(int mem, const uint64_t* d, size_t n, gx_h* out, size_t* bad);
gx_status gx_destroy_xfer_dlist(gx_h l);
gx_status gx_reg_dlist(int mem, const uint64_t* d, size_t n, const char* meta, const uint64_t* metaEnd, gx_h* out, size_t* bad);
gx_status gx_destroy_reg_dlist(gx_h l);
gx_status gx_string_list(gx_h l, char** out, size_t* outLen);
gx_status gx_plugins(gx_h a, char** out, size_t* outLen);
gx_status gx_params_flatten(gx_h p, char** out, size_t* outLen);
gx_status gx_mems_and_params(gx_h mems, gx_h params, int* memOut, size_t memCap, size_t* memN, char** pOut, size_t* pLen);
gx_status gx_plugin_params(gx_h a, const char* plugin, int* memOut, size_t memCap, size_t* memN, char** pOut, size_t* pLen);
gx_status gx_backend_params(gx_h a, gx_h b, int* memOut, size_t memCap, size_t* memN, char** pOut, size_t* pLen);
gx_status gx_get_notifs(gx_h a, gx_h map, gx_h o, char** out, size_t* outLen, size_t* count);
gx_status gx_create_notif_map(gx_h* m);
gx_status gx_destroy_notif_map(gx_h m);
gx_status gx_query_mem(gx_h a, gx_h l, gx_h o, size_t n, char* has, uint64_t* ends, char** out, size_t* outLen);
gx_status gx_build_opt(gx_h* out, const gx_h* backends, size_t nb, const void* notif, size_t nn, int has_notif, const void* custom, size_t nc, int skip_merge);
#endif
