// gx.c: dlopen loader and batch helpers over NIXL's C API. See gx.h.
#include <dlfcn.h>
#include "gx.h"

gx_api_t gx_api;
static void* gx_lib;

#define GX_REQ(field, name) { (void**)&gx_api.field, #name, 1 },
#define GX_OPT(field, name) { (void**)&gx_api.field, #name, 0 },
typedef struct { void** slot; const char* name; int required; } gx_sym;

static gx_sym gx_syms[] = { GX_SYMBOLS(GX_REQ, GX_OPT) };

// gx_dlopen dlopens path with flags; on failure it writes dlerror's reason into err and returns NULL.
static void* gx_dlopen(const char* path, int flags, char* err, size_t errlen) {
	void* h = dlopen(path, flags);
	if (!h) {
		const char* e = dlerror();
		snprintf(err, errlen, "%s", e ? e : "dlopen failed");
	}
	return h;
}

// gx_open dlopens path and resolves every symbol. It returns 0 on success; on failure it writes the reason
// into err. A failed open leaves no library loaded.
int gx_open(const char* path, char* err, size_t errlen) {
	void* h = gx_dlopen(path, RTLD_NOW | RTLD_LOCAL, err, errlen);
	if (!h) {
		return -1;
	}
	size_t n = sizeof(gx_syms) / sizeof(gx_syms[0]);
	for (size_t i = 0; i < n; i++) {
		void* p = dlsym(h, gx_syms[i].name);
		if (!p && gx_syms[i].required) {
			snprintf(err, errlen, "symbol %s not found: this libnixl_capi.so is too old or not NIXL's C API", gx_syms[i].name);
			memset(&gx_api, 0, sizeof(gx_api));
			dlclose(h);
			return -2;
		}
		*gx_syms[i].slot = p;
	}
	if (gx_api.is_stub && gx_api.is_stub()) {
		snprintf(err, errlen, "this libnixl_capi.so is NIXL's stub build (nixl_capi_is_stub() is true): it has no NIXL behind it");
		memset(&gx_api, 0, sizeof(gx_api));
		dlclose(h);
		return -3;
	}
	gx_lib = h;
	return 0;
}

int gx_has_custom_param(void) { return gx_api.opt_args_set_custom_param != NULL; }
int gx_has_skip_desc_merge(void) { return gx_api.opt_args_set_skip_desc_merge != NULL; }

// Thin trampolines: cgo cannot call C function pointers directly.
gx_status gx_create_agent(const char* name, const gx_agent_config* cfg, gx_h* out) { return gx_api.create_configured_agent(name, cfg, out); }
gx_status gx_destroy_agent(gx_h a) { return gx_api.destroy_agent(a); }
gx_status gx_get_local_md(gx_h a, void** d, size_t* n) { return gx_api.get_local_md(a, d, n); }
gx_status gx_get_local_partial_md(gx_h a, gx_h l, void** d, size_t* n, gx_h o) { return gx_api.get_local_partial_md(a, l, d, n, o); }
gx_status gx_load_remote_md(gx_h a, const void* d, size_t n, char** name) { return gx_api.load_remote_md(a, d, n, name); }
gx_status gx_invalidate_remote_md(gx_h a, const char* n) { return gx_api.invalidate_remote_md(a, n); }
gx_status gx_check_remote_md(gx_h a, const char* n, gx_h l) { return gx_api.check_remote_md(a, n, l); }
gx_status gx_create_backend(gx_h a, const char* p, gx_h params, gx_h* out) { return gx_api.create_backend(a, p, params, out); }
gx_status gx_destroy_backend(gx_h b) { return gx_api.destroy_backend(b); }
gx_status gx_create_opt_args(gx_h* o) { return gx_api.create_opt_args(o); }
gx_status gx_destroy_opt_args(gx_h o) { return gx_api.destroy_opt_args(o); }
gx_status gx_opt_args_add_backend(gx_h o, gx_h b) { return gx_api.opt_args_add_backend(o, b); }
gx_status gx_opt_args_set_notif(gx_h o, const void* d, size_t n) {
	gx_status s = gx_api.opt_args_set_notif_msg(o, d, n);
	if (s != 0) return s;
	return gx_api.opt_args_set_has_notif(o, true);
}
gx_status gx_opt_args_set_custom_param(gx_h o, const void* d, size_t n) { return gx_api.opt_args_set_custom_param(o, d, n); }
gx_status gx_create_params(gx_h* p) { return gx_api.create_params(p); }
gx_status gx_params_add(gx_h p, const char* k, const char* v) { return gx_api.params_add(p, k, v); }
gx_status gx_destroy_params(gx_h p) { return gx_api.destroy_params(p); }
gx_status gx_register_mem(gx_h a, gx_h l, gx_h o) { return gx_api.register_mem(a, l, o); }
gx_status gx_deregister_mem(gx_h a, gx_h l, gx_h o) { return gx_api.deregister_mem(a, l, o); }
gx_status gx_make_connection(gx_h a, const char* r, gx_h o) { return gx_api.make_connection(a, r, o); }
gx_status gx_prep_xfer_dlist(gx_h a, const char* n, gx_h l, gx_h* out, gx_h o) { return gx_api.prep_xfer_dlist(a, n, l, out, o); }
gx_status gx_release_xfer_dlist_handle(gx_h a, gx_h d) { return gx_api.release_xfer_dlist_handle(a, d); }
gx_status gx_make_xfer_req(gx_h a, int op, gx_h l, const int* li, size_t ln, gx_h r, const int* ri, size_t rn, gx_h* out, gx_h o) {
	return gx_api.make_xfer_req(a, op, l, li, ln, r, ri, rn, out, o);
}
gx_status gx_create_xfer_req(gx_h a, int op, gx_h l, gx_h r, const char* n, gx_h* out, gx_h o) { return gx_api.create_xfer_req(a, op, l, r, n, out, o); }
gx_status gx_estimate_xfer_cost(gx_h a, gx_h x, gx_h o, int64_t* d, int64_t* e, int* m) { return gx_api.estimate_xfer_cost(a, x, o, d, e, m); }
gx_status gx_post_xfer_req(gx_h a, gx_h x, gx_h o) { return gx_api.post_xfer_req(a, x, o); }
gx_status gx_get_xfer_status(gx_h a, gx_h x) { return gx_api.get_xfer_status(a, x); }
gx_status gx_get_xfer_telemetry(gx_h a, gx_h x, gx_telemetry* t) { return gx_api.get_xfer_telemetry(a, x, t); }
gx_status gx_gen_notif(gx_h a, const char* r, const void* d, size_t n, gx_h o) { return gx_api.gen_notif(a, r, d, n, o); }

// gx_release_xfer releases the NIXL request and frees its wrapper (the C API needs both calls).
gx_status gx_release_xfer(gx_h a, gx_h x) {
	gx_status s = gx_api.release_xfer_req(a, x);
	if (s != 0) return s;
	return gx_api.destroy_xfer_req(x);
}

// gx_query_xfer_backend returns the NIXL backend handle (the pointer inside the C API's wrapper) that NIXL
// chose for a request, so it can be matched against the agent's backends.
gx_status gx_query_xfer_backend(gx_h a, gx_h x, void** inner) {
	gx_h b = NULL;
	gx_status s = gx_api.query_xfer_backend(a, x, &b);
	if (s != 0) return s;
	*inner = *(void**)b; // struct nixl_capi_backend_s { nixlBackendH* backend; }
	gx_api.destroy_backend(b);
	return 0;
}
void* gx_backend_inner(gx_h b) { return *(void**)b; }

// gx_xfer_dlist builds a transfer descriptor list from n (addr, len, devID) triples in one call.
gx_status gx_xfer_dlist(int mem, const uint64_t* d, size_t n, gx_h* out, size_t* bad) {
	gx_h l = NULL;
	gx_status s = gx_api.create_xfer_dlist(mem, &l);
	if (s != 0) return s;
	for (size_t i = 0; i < n; i++) {
		s = gx_api.xfer_dlist_add_desc(l, (uintptr_t)d[3*i], (size_t)d[3*i+1], d[3*i+2]);
		if (s != 0) { *bad = i; gx_api.destroy_xfer_dlist(l); return s; }
	}
	*out = l;
	return 0;
}
gx_status gx_destroy_xfer_dlist(gx_h l) { return gx_api.destroy_xfer_dlist(l); }

// gx_reg_dlist builds a registration list; meta (may be NULL) holds every descriptor's metadata back to back,
// metaEnd[i] is the end offset of descriptor i's metadata.
gx_status gx_reg_dlist(int mem, const uint64_t* d, size_t n, const char* meta, const uint64_t* metaEnd, gx_h* out, size_t* bad) {
	gx_h l = NULL;
	gx_status s = gx_api.create_reg_dlist(mem, &l);
	if (s != 0) return s;
	uint64_t start = 0;
	for (size_t i = 0; i < n; i++) {
		const void* m = NULL;
		size_t mlen = 0;
		if (meta && metaEnd) { m = meta + start; mlen = (size_t)(metaEnd[i] - start); start = metaEnd[i]; }
		s = gx_api.reg_dlist_add_desc(l, (uintptr_t)d[3*i], (size_t)d[3*i+1], d[3*i+2], mlen ? m : NULL, mlen);
		if (s != 0) { *bad = i; gx_api.destroy_reg_dlist(l); return s; }
	}
	*out = l;
	return 0;
}
gx_status gx_destroy_reg_dlist(gx_h l) { return gx_api.destroy_reg_dlist(l); }

// gx_string_list returns the list's strings joined by '\n' in a malloc'd buffer (the caller frees it).
gx_status gx_string_list(gx_h l, char** out, size_t* outLen) {
	size_t n = 0, total = 0;
	gx_status s = gx_api.string_list_size(l, &n);
	if (s != 0) return s;
	for (size_t i = 0; i < n; i++) {
		const char* str = NULL;
		if ((s = gx_api.string_list_get(l, i, &str)) != 0) return s;
		total += strlen(str) + 1;
	}
	char* buf = malloc(total + 1);
	if (!buf) return -2;
	size_t pos = 0;
	for (size_t i = 0; i < n; i++) {
		const char* str = NULL;
		gx_api.string_list_get(l, i, &str);
		size_t k = strlen(str);
		memcpy(buf + pos, str, k);
		pos += k;
		buf[pos++] = '\n';
	}
	buf[pos] = 0;
	*out = buf;
	*outLen = pos;
	return 0;
}

gx_status gx_plugins(gx_h a, char** out, size_t* outLen) {
	gx_h l = NULL;
	gx_status s = gx_api.get_available_plugins(a, &l);
	if (s != 0) return s;
	s = gx_string_list(l, out, outLen);
	gx_api.destroy_string_list(l);
	return s;
}

// gx_params_flatten writes "key\0value\0" pairs into a malloc'd buffer.
gx_status gx_params_flatten(gx_h p, char** out, size_t* outLen) {
	bool empty = true;
	gx_status s = gx_api.params_is_empty(p, &empty);
	if (s != 0) return s;
	size_t cap = 256, pos = 0;
	char* buf = malloc(cap);
	if (!buf) return -2;
	if (!empty) {
		gx_h it = NULL;
		if ((s = gx_api.params_create_iterator(p, &it)) != 0) { free(buf); return s; }
		bool more = true;
		while (more) {
			const char* k = NULL; const char* v = NULL;
			if ((s = gx_api.params_iterator_next(it, &k, &v, &more)) != 0) { gx_api.params_destroy_iterator(it); free(buf); return s; }
			if (!k) break;
			size_t kl = strlen(k), vl = v ? strlen(v) : 0;
			while (pos + kl + vl + 2 > cap) { cap *= 2; char* nb = realloc(buf, cap); if (!nb) { gx_api.params_destroy_iterator(it); free(buf); return -2; } buf = nb; }
			memcpy(buf + pos, k, kl); pos += kl; buf[pos++] = 0;
			if (vl) memcpy(buf + pos, v, vl);
			pos += vl; buf[pos++] = 0;
		}
		gx_api.params_destroy_iterator(it);
	}
	*out = buf;
	*outLen = pos;
	return 0;
}

// gx_mems_and_params flattens a (mem list, params) pair and destroys both.
gx_status gx_mems_and_params(gx_h mems, gx_h params, int* memOut, size_t memCap, size_t* memN, char** pOut, size_t* pLen) {
	size_t n = 0;
	gx_status s = gx_api.mem_list_size(mems, &n);
	if (s == 0) {
		for (size_t i = 0; i < n && i < memCap; i++) gx_api.mem_list_get(mems, i, &memOut[i]);
		*memN = n < memCap ? n : memCap;
		s = gx_params_flatten(params, pOut, pLen);
	}
	gx_api.destroy_mem_list(mems);
	gx_api.destroy_params(params);
	return s;
}

gx_status gx_plugin_params(gx_h a, const char* plugin, int* memOut, size_t memCap, size_t* memN, char** pOut, size_t* pLen) {
	gx_h mems = NULL, params = NULL;
	gx_status s = gx_api.get_plugin_params(a, plugin, &mems, &params);
	if (s != 0) return s;
	return gx_mems_and_params(mems, params, memOut, memCap, memN, pOut, pLen);
}

gx_status gx_backend_params(gx_h a, gx_h b, int* memOut, size_t memCap, size_t* memN, char** pOut, size_t* pLen) {
	gx_h mems = NULL, params = NULL;
	gx_status s = gx_api.get_backend_params(a, b, &mems, &params);
	if (s != 0) return s;
	return gx_mems_and_params(mems, params, memOut, memCap, memN, pOut, pLen);
}

// gx_get_notifs drains the agent's new notifications into one malloc'd buffer:
// repeated records [u32 agent_len][agent][u32 msg_len][msg] (one record per message).
gx_status gx_get_notifs(gx_h a, gx_h map, gx_h o, char** out, size_t* outLen, size_t* count) {
	gx_status s = gx_api.notif_map_clear(map);
	if (s != 0) return s;
	if ((s = gx_api.get_notifs(a, map, o)) != 0) return s;
	size_t agents = 0, total = 0, msgs = 0;
	if ((s = gx_api.notif_map_size(map, &agents)) != 0) return s;
	for (size_t i = 0; i < agents; i++) {
		const char* name = NULL; size_t k = 0;
		if ((s = gx_api.notif_map_get_agent_at(map, i, &name)) != 0) return s;
		if ((s = gx_api.notif_map_get_notifs_size(map, name, &k)) != 0) return s;
		for (size_t j = 0; j < k; j++) {
			const void* d = NULL; size_t n = 0;
			if ((s = gx_api.notif_map_get_notif(map, name, j, &d, &n)) != 0) return s;
			total += 8 + strlen(name) + n;
			msgs++;
		}
	}
	*count = msgs;
	*outLen = total;
	*out = NULL;
	if (msgs == 0) return 0;
	char* buf = malloc(total);
	if (!buf) return -2;
	size_t pos = 0;
	for (size_t i = 0; i < agents; i++) {
		const char* name = NULL; size_t k = 0;
		gx_api.notif_map_get_agent_at(map, i, &name);
		gx_api.notif_map_get_notifs_size(map, name, &k);
		uint32_t nl = (uint32_t)strlen(name);
		for (size_t j = 0; j < k; j++) {
			const void* d = NULL; size_t n = 0;
			gx_api.notif_map_get_notif(map, name, j, &d, &n);
			uint32_t ml = (uint32_t)n;
			memcpy(buf + pos, &nl, 4); pos += 4;
			memcpy(buf + pos, name, nl); pos += nl;
			memcpy(buf + pos, &ml, 4); pos += 4;
			if (n) memcpy(buf + pos, d, n);
			pos += n;
		}
	}
	gx_api.notif_map_clear(map);
	*out = buf;
	return 0;
}
gx_status gx_create_notif_map(gx_h* m) { return gx_api.create_notif_map(m); }
gx_status gx_destroy_notif_map(gx_h m) { return gx_api.destroy_notif_map(m); }

// gx_query_mem runs queryMem on a registration list and flattens the answers: for each descriptor a byte
// has[i] and, when set, its params as "key\0value\0" pairs separated per descriptor by ends[i].
gx_status gx_query_mem(gx_h a, gx_h l, gx_h o, size_t n, char* has, uint64_t* ends, char** out, size_t* outLen) {
	gx_h resp = NULL;
	gx_status s = gx_api.create_query_resp_list(&resp);
	if (s != 0) return s;
	if ((s = gx_api.query_mem(a, l, resp, o)) != 0) { gx_api.destroy_query_resp_list(resp); return s; }
	size_t m = 0;
	gx_api.query_resp_list_size(resp, &m);
	size_t cap = 64, pos = 0;
	char* buf = malloc(cap);
	for (size_t i = 0; i < n; i++) {
		bool hv = false;
		if (i < m) gx_api.query_resp_list_has_value(resp, i, &hv);
		has[i] = hv ? 1 : 0;
		if (hv) {
			gx_h p = NULL; char* flat = NULL; size_t fl = 0;
			if (gx_api.query_resp_list_get_params(resp, i, &p) == 0 && gx_params_flatten(p, &flat, &fl) == 0) {
				while (pos + fl > cap) { cap *= 2; buf = realloc(buf, cap); }
				memcpy(buf + pos, flat, fl); pos += fl;
				free(flat);
			}
			if (p) gx_api.destroy_params(p);
		}
		ends[i] = pos;
	}
	gx_api.destroy_query_resp_list(resp);
	*out = buf;
	*outLen = pos;
	return 0;
}

// gx_build_opt creates optional args carrying backends and/or a notification in one call; *out stays NULL
// when nothing is set.
gx_status gx_build_opt(gx_h* out, const gx_h* backends, size_t nb, const void* notif, size_t nn, int has_notif, const void* custom, size_t nc, int skip_merge) {
	*out = NULL;
	if (nb == 0 && !has_notif && nc == 0 && !skip_merge) return 0;
	gx_h o = NULL;
	gx_status s = gx_api.create_opt_args(&o);
	if (s != 0) return s;
	for (size_t i = 0; i < nb; i++) {
		if ((s = gx_api.opt_args_add_backend(o, backends[i])) != 0) { gx_api.destroy_opt_args(o); return s; }
	}
	if (has_notif) {
		// An empty notification is still a notification: NIXL sends it when has_notif is set.
		static const char empty = 0;
		if ((s = gx_api.opt_args_set_notif_msg(o, nn ? notif : (const void*)&empty, nn)) != 0) { gx_api.destroy_opt_args(o); return s; }
		if ((s = gx_api.opt_args_set_has_notif(o, true)) != 0) { gx_api.destroy_opt_args(o); return s; }
	}
	if (nc > 0) {
		if (!gx_api.opt_args_set_custom_param) { gx_api.destroy_opt_args(o); return -1; }
		if ((s = gx_api.opt_args_set_custom_param(o, custom, nc)) != 0) { gx_api.destroy_opt_args(o); return s; }
	}
	if (skip_merge) {
		if (!gx_api.opt_args_set_skip_desc_merge) { gx_api.destroy_opt_args(o); return -1; }
		if ((s = gx_api.opt_args_set_skip_desc_merge(o, true)) != 0) { gx_api.destroy_opt_args(o); return s; }
	}
	*out = o;
	return 0;
}

// gx_preload dlopens path with RTLD_GLOBAL and keeps it loaded for the life of the process: a dependency of a
// plugin (libfabric.so.1, libhwloc.so.15 …) that the dynamic loader would not find by itself; once loaded,
// a later DT_NEEDED of the same soname resolves to it. It returns 0 on success, else writes dlerror's reason.
int gx_preload(const char* path, char* err, size_t errlen) {
	return gx_dlopen(path, RTLD_NOW | RTLD_GLOBAL, err, errlen) ? 0 : -1;
}
