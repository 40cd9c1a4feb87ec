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
// src/bindings/rust/wrapper.h), declared here by gonixl as function-pointer slots so that the module builds
// with no NIXL installed. Each handle kind and enum has its own name below: an opaque pointer (or int) here,
// NIXL's own type when testdata/capi_check.c compiles this header after NIXL's wrapper.h with GX_NIXL_TYPES
// defined, where every slot must then have exactly the type of NIXL's function (`make lint`).
#ifdef GX_NIXL_TYPES
typedef nixl_capi_status_t gx_status;
typedef nixl_capi_agent_t gx_agent_t;
typedef nixl_capi_params_t gx_params_t;
typedef nixl_capi_mem_list_t gx_mem_list_t;
typedef nixl_capi_string_list_t gx_string_list_t;
typedef nixl_capi_backend_t gx_backend_t;
typedef nixl_capi_opt_args_t gx_opt_args_t;
typedef nixl_capi_param_iter_t gx_param_iter_t;
typedef nixl_capi_xfer_dlist_t gx_xfer_dlist_t;
typedef nixl_capi_xfer_dlist_handle_t gx_dlist_handle_t;
typedef nixl_capi_reg_dlist_t gx_reg_dlist_t;
typedef nixl_capi_xfer_req_t gx_xfer_req_t;
typedef nixl_capi_notif_map_t gx_notif_map_t;
typedef nixl_capi_query_resp_list_t gx_query_resp_list_t;
typedef nixl_capi_mem_type_t gx_mem_type_t;
typedef nixl_capi_xfer_op_t gx_xfer_op_t;
typedef nixl_capi_cost_t gx_cost_t;
typedef nixl_capi_agent_config_t gx_agent_config;
typedef struct nixl_capi_xfer_telemetry_s gx_telemetry;
#else
typedef int gx_status;
typedef void* gx_agent_t;
typedef void* gx_params_t;
typedef void* gx_mem_list_t;
typedef void* gx_string_list_t;
typedef void* gx_backend_t;
typedef void* gx_opt_args_t;
typedef void* gx_param_iter_t;
typedef void* gx_xfer_dlist_t;
typedef void* gx_dlist_handle_t;
typedef void* gx_reg_dlist_t;
typedef void* gx_xfer_req_t;
typedef void* gx_notif_map_t;
typedef void* gx_query_resp_list_t;
typedef int gx_mem_type_t;
typedef int gx_xfer_op_t;
typedef int gx_cost_t;
#endif
// gonixl's helpers below take any handle as gx_h.
typedef void* gx_h;

// nixl_capi_agent_config_t and struct nixl_capi_xfer_telemetry_s, field by field (capi_check.c compares the
// layouts).
#define GX_AGENT_CONFIG_FIELDS \
	bool enable_prog_thread; \
	bool enable_listen_thread; \
	int listen_port; \
	int thread_sync; \
	unsigned int num_workers; \
	uint64_t pthr_delay_us; \
	uint64_t lthr_delay_us; \
	bool capture_telemetry;
#define GX_TELEMETRY_FIELDS \
	uint64_t start_time_us; \
	uint64_t post_duration_us; \
	uint64_t xfer_duration_us; \
	uint64_t total_bytes; \
	uint64_t desc_count;
#ifndef GX_NIXL_TYPES
typedef struct { GX_AGENT_CONFIG_FIELDS } gx_agent_config;
typedef struct { GX_TELEMETRY_FIELDS } gx_telemetry;
#endif

// One slot per C API function gonixl uses; required ones must resolve at load time.
typedef struct {
	gx_status (*create_configured_agent)(const char*, const gx_agent_config*, gx_agent_t*);
	gx_status (*destroy_agent)(gx_agent_t);
	gx_status (*get_local_md)(gx_agent_t, void**, size_t*);
	gx_status (*get_local_partial_md)(gx_agent_t, gx_reg_dlist_t, void**, size_t*, gx_opt_args_t);
	gx_status (*load_remote_md)(gx_agent_t, const void*, size_t, char**);
	gx_status (*invalidate_remote_md)(gx_agent_t, const char*);
	gx_status (*check_remote_md)(gx_agent_t, const char*, gx_xfer_dlist_t);
	gx_status (*get_available_plugins)(gx_agent_t, gx_string_list_t*);
	gx_status (*destroy_string_list)(gx_string_list_t);
	gx_status (*string_list_size)(gx_string_list_t, size_t*);
	gx_status (*string_list_get)(gx_string_list_t, size_t, const char**);
	gx_status (*get_plugin_params)(gx_agent_t, const char*, gx_mem_list_t*, gx_params_t*);
	gx_status (*destroy_mem_list)(gx_mem_list_t);
	gx_status (*destroy_params)(gx_params_t);
	gx_status (*create_backend)(gx_agent_t, const char*, gx_params_t, gx_backend_t*);
	gx_status (*destroy_backend)(gx_backend_t);
	gx_status (*get_backend_params)(gx_agent_t, gx_backend_t, gx_mem_list_t*, gx_params_t*);
	gx_status (*create_opt_args)(gx_opt_args_t*);
	gx_status (*destroy_opt_args)(gx_opt_args_t);
	gx_status (*opt_args_add_backend)(gx_opt_args_t, gx_backend_t);
	gx_status (*opt_args_set_notif_msg)(gx_opt_args_t, const void*, size_t);
	gx_status (*opt_args_set_has_notif)(gx_opt_args_t, bool);
	gx_status (*create_params)(gx_params_t*);
	gx_status (*params_add)(gx_params_t, const char*, const char*);
	gx_status (*params_is_empty)(gx_params_t, bool*);
	gx_status (*params_create_iterator)(gx_params_t, gx_param_iter_t*);
	gx_status (*params_iterator_next)(gx_param_iter_t, const char**, const char**, bool*);
	gx_status (*params_destroy_iterator)(gx_param_iter_t);
	gx_status (*mem_list_size)(gx_mem_list_t, size_t*);
	gx_status (*mem_list_get)(gx_mem_list_t, size_t, gx_mem_type_t*);
	gx_status (*register_mem)(gx_agent_t, gx_reg_dlist_t, gx_opt_args_t);
	gx_status (*deregister_mem)(gx_agent_t, gx_reg_dlist_t, gx_opt_args_t);
	gx_status (*make_connection)(gx_agent_t, const char*, gx_opt_args_t);
	gx_status (*prep_xfer_dlist)(gx_agent_t, const char*, gx_xfer_dlist_t, gx_dlist_handle_t*, gx_opt_args_t);
	gx_status (*release_xfer_dlist_handle)(gx_agent_t, gx_dlist_handle_t);
	gx_status (*make_xfer_req)(gx_agent_t, gx_xfer_op_t, gx_dlist_handle_t, const int*, size_t, gx_dlist_handle_t, const int*, size_t, gx_xfer_req_t*, gx_opt_args_t);
	gx_status (*create_xfer_req)(gx_agent_t, gx_xfer_op_t, gx_xfer_dlist_t, gx_xfer_dlist_t, const char*, gx_xfer_req_t*, gx_opt_args_t);
	gx_status (*estimate_xfer_cost)(gx_agent_t, gx_xfer_req_t, gx_opt_args_t, int64_t*, int64_t*, gx_cost_t*);
	gx_status (*post_xfer_req)(gx_agent_t, gx_xfer_req_t, gx_opt_args_t);
	gx_status (*get_xfer_status)(gx_agent_t, gx_xfer_req_t);
	gx_status (*query_xfer_backend)(gx_agent_t, gx_xfer_req_t, gx_backend_t*);
	gx_status (*release_xfer_req)(gx_agent_t, gx_xfer_req_t);
	gx_status (*destroy_xfer_req)(gx_xfer_req_t);
	gx_status (*get_xfer_telemetry)(gx_agent_t, gx_xfer_req_t, gx_telemetry*);
	gx_status (*get_notifs)(gx_agent_t, gx_notif_map_t, gx_opt_args_t);
	gx_status (*create_notif_map)(gx_notif_map_t*);
	gx_status (*destroy_notif_map)(gx_notif_map_t);
	gx_status (*notif_map_size)(gx_notif_map_t, size_t*);
	gx_status (*notif_map_get_agent_at)(gx_notif_map_t, size_t, const char**);
	gx_status (*notif_map_get_notifs_size)(gx_notif_map_t, const char*, size_t*);
	gx_status (*notif_map_get_notif)(gx_notif_map_t, const char*, size_t, const void**, size_t*);
	gx_status (*notif_map_clear)(gx_notif_map_t);
	gx_status (*gen_notif)(gx_agent_t, const char*, const void*, size_t, gx_opt_args_t);
	gx_status (*create_xfer_dlist)(gx_mem_type_t, gx_xfer_dlist_t*);
	gx_status (*destroy_xfer_dlist)(gx_xfer_dlist_t);
	gx_status (*xfer_dlist_add_desc)(gx_xfer_dlist_t, uintptr_t, size_t, uint64_t);
	gx_status (*create_reg_dlist)(gx_mem_type_t, gx_reg_dlist_t*);
	gx_status (*destroy_reg_dlist)(gx_reg_dlist_t);
	gx_status (*reg_dlist_add_desc)(gx_reg_dlist_t, uintptr_t, size_t, uint64_t, const void*, size_t);
	gx_status (*create_query_resp_list)(gx_query_resp_list_t*);
	gx_status (*destroy_query_resp_list)(gx_query_resp_list_t);
	gx_status (*query_resp_list_size)(gx_query_resp_list_t, size_t*);
	gx_status (*query_resp_list_has_value)(gx_query_resp_list_t, size_t, bool*);
	gx_status (*query_resp_list_get_params)(gx_query_resp_list_t, size_t, gx_params_t*);
	gx_status (*query_mem)(gx_agent_t, gx_reg_dlist_t, gx_query_resp_list_t, gx_opt_args_t);
	bool (*is_stub)(void);
	// Optional (newer NIXL): probed at load time, NULL when absent.
	gx_status (*opt_args_set_custom_param)(gx_opt_args_t, const void*, size_t);
	gx_status (*opt_args_set_skip_desc_merge)(gx_opt_args_t, bool);
} gx_api_t;

// GX_SYMBOLS(REQ, OPT) lists every slot with the symbol that fills it: REQ(slot, symbol) for required ones,
// OPT(slot, symbol) for optional ones (gx.c's symbol table; capi_check.c's comparison with NIXL's header).
#define GX_SYMBOLS(REQ, OPT) \
	REQ(create_configured_agent, nixl_capi_create_configured_agent) \
	REQ(destroy_agent, nixl_capi_destroy_agent) \
	REQ(get_local_md, nixl_capi_get_local_md) \
	REQ(get_local_partial_md, nixl_capi_get_local_partial_md) \
	REQ(load_remote_md, nixl_capi_load_remote_md) \
	REQ(invalidate_remote_md, nixl_capi_invalidate_remote_md) \
	REQ(check_remote_md, nixl_capi_check_remote_md) \
	REQ(get_available_plugins, nixl_capi_get_available_plugins) \
	REQ(destroy_string_list, nixl_capi_destroy_string_list) \
	REQ(string_list_size, nixl_capi_string_list_size) \
	REQ(string_list_get, nixl_capi_string_list_get) \
	REQ(get_plugin_params, nixl_capi_get_plugin_params) \
	REQ(destroy_mem_list, nixl_capi_destroy_mem_list) \
	REQ(destroy_params, nixl_capi_destroy_params) \
	REQ(create_backend, nixl_capi_create_backend) \
	REQ(destroy_backend, nixl_capi_destroy_backend) \
	REQ(get_backend_params, nixl_capi_get_backend_params) \
	REQ(create_opt_args, nixl_capi_create_opt_args) \
	REQ(destroy_opt_args, nixl_capi_destroy_opt_args) \
	REQ(opt_args_add_backend, nixl_capi_opt_args_add_backend) \
	REQ(opt_args_set_notif_msg, nixl_capi_opt_args_set_notif_msg) \
	REQ(opt_args_set_has_notif, nixl_capi_opt_args_set_has_notif) \
	REQ(create_params, nixl_capi_create_params) \
	REQ(params_add, nixl_capi_params_add) \
	REQ(params_is_empty, nixl_capi_params_is_empty) \
	REQ(params_create_iterator, nixl_capi_params_create_iterator) \
	REQ(params_iterator_next, nixl_capi_params_iterator_next) \
	REQ(params_destroy_iterator, nixl_capi_params_destroy_iterator) \
	REQ(mem_list_size, nixl_capi_mem_list_size) \
	REQ(mem_list_get, nixl_capi_mem_list_get) \
	REQ(register_mem, nixl_capi_register_mem) \
	REQ(deregister_mem, nixl_capi_deregister_mem) \
	REQ(make_connection, nixl_capi_agent_make_connection) \
	REQ(prep_xfer_dlist, nixl_capi_prep_xfer_dlist) \
	REQ(release_xfer_dlist_handle, nixl_capi_release_xfer_dlist_handle) \
	REQ(make_xfer_req, nixl_capi_make_xfer_req) \
	REQ(create_xfer_req, nixl_capi_create_xfer_req) \
	REQ(estimate_xfer_cost, nixl_capi_estimate_xfer_cost) \
	REQ(post_xfer_req, nixl_capi_post_xfer_req) \
	REQ(get_xfer_status, nixl_capi_get_xfer_status) \
	REQ(query_xfer_backend, nixl_capi_query_xfer_backend) \
	REQ(release_xfer_req, nixl_capi_release_xfer_req) \
	REQ(destroy_xfer_req, nixl_capi_destroy_xfer_req) \
	REQ(get_xfer_telemetry, nixl_capi_get_xfer_telemetry) \
	REQ(get_notifs, nixl_capi_get_notifs) \
	REQ(create_notif_map, nixl_capi_create_notif_map) \
	REQ(destroy_notif_map, nixl_capi_destroy_notif_map) \
	REQ(notif_map_size, nixl_capi_notif_map_size) \
	REQ(notif_map_get_agent_at, nixl_capi_notif_map_get_agent_at) \
	REQ(notif_map_get_notifs_size, nixl_capi_notif_map_get_notifs_size) \
	REQ(notif_map_get_notif, nixl_capi_notif_map_get_notif) \
	REQ(notif_map_clear, nixl_capi_notif_map_clear) \
	REQ(gen_notif, nixl_capi_gen_notif) \
	REQ(create_xfer_dlist, nixl_capi_create_xfer_dlist) \
	REQ(destroy_xfer_dlist, nixl_capi_destroy_xfer_dlist) \
	REQ(xfer_dlist_add_desc, nixl_capi_xfer_dlist_add_desc) \
	REQ(create_reg_dlist, nixl_capi_create_reg_dlist) \
	REQ(destroy_reg_dlist, nixl_capi_destroy_reg_dlist) \
	REQ(reg_dlist_add_desc, nixl_capi_reg_dlist_add_desc) \
	REQ(create_query_resp_list, nixl_capi_create_query_resp_list) \
	REQ(destroy_query_resp_list, nixl_capi_destroy_query_resp_list) \
	REQ(query_resp_list_size, nixl_capi_query_resp_list_size) \
	REQ(query_resp_list_has_value, nixl_capi_query_resp_list_has_value) \
	REQ(query_resp_list_get_params, nixl_capi_query_resp_list_get_params) \
	REQ(query_mem, nixl_capi_query_mem) \
	OPT(is_stub, nixl_capi_is_stub) \
	OPT(opt_args_set_custom_param, nixl_capi_opt_args_set_custom_param) \
	OPT(opt_args_set_skip_desc_merge, nixl_capi_opt_args_set_skip_desc_merge)



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
