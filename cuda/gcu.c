//go:build cgo

// Implementation of gcu.h: function pointers resolved from libcuda.so.1 with dlsym. See gcu.h.
#include "gcu.h"

#include <dlfcn.h>
#include <stdlib.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

// Driver prototypes, as documented for the CUDA driver API (types reduced to their ABI).
typedef gcu_result (*fn_init)(unsigned int);
typedef gcu_result (*fn_int_out)(int *);
typedef gcu_result (*fn_device_get)(gcu_device *, int);
typedef gcu_result (*fn_device_name)(char *, int, gcu_device);
typedef gcu_result (*fn_device_total_mem)(size_t *, gcu_device);
typedef gcu_result (*fn_device_attr)(int *, int, gcu_device);
typedef gcu_result (*fn_device_uuid)(unsigned char *, gcu_device);
typedef gcu_result (*fn_primary_retain)(void **, gcu_device);
typedef gcu_result (*fn_primary_release)(gcu_device);
typedef gcu_result (*fn_ctx_set)(void *);
typedef gcu_result (*fn_void)(void);
typedef gcu_result (*fn_mem_info)(size_t *, size_t *);
typedef gcu_result (*fn_mem_alloc)(gcu_dptr *, size_t);
typedef gcu_result (*fn_mem_free)(gcu_dptr);
typedef gcu_result (*fn_host_alloc)(void **, size_t, unsigned int);
typedef gcu_result (*fn_host_free)(void *);
typedef gcu_result (*fn_host_register)(void *, size_t, unsigned int);
typedef gcu_result (*fn_memset8)(gcu_dptr, unsigned char, size_t);
typedef gcu_result (*fn_htod)(gcu_dptr, const void *, size_t);
typedef gcu_result (*fn_dtoh)(void *, gcu_dptr, size_t);
typedef gcu_result (*fn_dtod)(gcu_dptr, gcu_dptr, size_t);
typedef gcu_result (*fn_htod_async)(gcu_dptr, const void *, size_t, void *);
typedef gcu_result (*fn_dtoh_async)(void *, gcu_dptr, size_t, void *);
typedef gcu_result (*fn_dtod_async)(gcu_dptr, gcu_dptr, size_t, void *);
typedef gcu_result (*fn_stream_create)(void **, unsigned int);
typedef gcu_result (*fn_handle)(void *);
typedef gcu_result (*fn_stream_wait_event)(void *, void *, unsigned int);
typedef gcu_result (*fn_event_create)(void **, unsigned int);
typedef gcu_result (*fn_event_record)(void *, void *);
typedef gcu_result (*fn_event_elapsed)(float *, void *, void *);
typedef gcu_result (*fn_pointer_attr)(void *, int, gcu_dptr);
typedef gcu_result (*fn_error_str)(gcu_result, const char **);

static struct {
	fn_init init;
	fn_int_out driver_version;
	fn_int_out device_count;
	fn_device_get device_get;
	fn_device_name device_name;
	fn_device_total_mem device_total_mem;
	fn_device_attr device_attr;
	fn_device_name device_pci_bus_id; // same shape: (char*, int, CUdevice)
	fn_device_uuid device_uuid;
	fn_primary_retain primary_retain;
	fn_primary_release primary_release;
	fn_ctx_set ctx_set;
	fn_void ctx_sync;
	fn_mem_info mem_info;
	fn_mem_alloc mem_alloc;
	fn_mem_free mem_free;
	fn_host_alloc host_alloc;
	fn_host_free host_free;
	fn_host_register host_register;
	fn_host_free host_unregister;
	fn_memset8 memset8;
	fn_htod htod;
	fn_dtoh dtoh;
	fn_dtod dtod;
	fn_htod_async htod_async;
	fn_dtoh_async dtoh_async;
	fn_dtod_async dtod_async;
	fn_stream_create stream_create;
	fn_handle stream_destroy;
	fn_handle stream_sync;
	fn_handle stream_query;
	fn_stream_wait_event stream_wait_event;
	fn_event_create event_create;
	fn_handle event_destroy;
	fn_event_record event_record;
	fn_handle event_sync;
	fn_handle event_query;
	fn_event_elapsed event_elapsed;
	fn_pointer_attr pointer_attr;
	fn_error_str error_name;
	fn_error_str error_string;
} api;

// The symbol table: which slot gets which exported name. Where the driver exports a _v2 (or newer) entry
// point it is listed first; the unversioned name is a fallback for older drivers only.
#define H(x) ((void *)(x))
#define SLOT(f) ((void **)&api.f)
static const struct {
	void **slot;
	const char *names[2];
} syms[] = {
	{SLOT(init), {"cuInit", NULL}},
	{SLOT(driver_version), {"cuDriverGetVersion", NULL}},
	{SLOT(device_count), {"cuDeviceGetCount", NULL}},
	{SLOT(device_get), {"cuDeviceGet", NULL}},
	{SLOT(device_name), {"cuDeviceGetName", NULL}},
	{SLOT(device_total_mem), {"cuDeviceTotalMem_v2", NULL}},
	{SLOT(device_attr), {"cuDeviceGetAttribute", NULL}},
	{SLOT(device_pci_bus_id), {"cuDeviceGetPCIBusId", NULL}},
	{SLOT(device_uuid), {"cuDeviceGetUuid_v2", "cuDeviceGetUuid"}},
	{SLOT(primary_retain), {"cuDevicePrimaryCtxRetain", NULL}},
	{SLOT(primary_release), {"cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease"}},
	{SLOT(ctx_set), {"cuCtxSetCurrent", NULL}},
	{SLOT(ctx_sync), {"cuCtxSynchronize", NULL}},
	{SLOT(mem_info), {"cuMemGetInfo_v2", NULL}},
	{SLOT(mem_alloc), {"cuMemAlloc_v2", NULL}},
	{SLOT(mem_free), {"cuMemFree_v2", NULL}},
	{SLOT(host_alloc), {"cuMemHostAlloc", NULL}},
	{SLOT(host_free), {"cuMemFreeHost", NULL}},
	{SLOT(host_register), {"cuMemHostRegister_v2", "cuMemHostRegister"}},
	{SLOT(host_unregister), {"cuMemHostUnregister", NULL}},
	{SLOT(memset8), {"cuMemsetD8_v2", NULL}},
	{SLOT(htod), {"cuMemcpyHtoD_v2", NULL}},
	{SLOT(dtoh), {"cuMemcpyDtoH_v2", NULL}},
	{SLOT(dtod), {"cuMemcpyDtoD_v2", NULL}},
	{SLOT(htod_async), {"cuMemcpyHtoDAsync_v2", NULL}},
	{SLOT(dtoh_async), {"cuMemcpyDtoHAsync_v2", NULL}},
	{SLOT(dtod_async), {"cuMemcpyDtoDAsync_v2", NULL}},
	{SLOT(stream_create), {"cuStreamCreate", NULL}},
	{SLOT(stream_destroy), {"cuStreamDestroy_v2", NULL}},
	{SLOT(stream_sync), {"cuStreamSynchronize", NULL}},
	{SLOT(stream_query), {"cuStreamQuery", NULL}},
	{SLOT(stream_wait_event), {"cuStreamWaitEvent", NULL}},
	{SLOT(event_create), {"cuEventCreate", NULL}},
	{SLOT(event_destroy), {"cuEventDestroy_v2", NULL}},
	{SLOT(event_record), {"cuEventRecord", NULL}},
	{SLOT(event_sync), {"cuEventSynchronize", NULL}},
	{SLOT(event_query), {"cuEventQuery", NULL}},
	{SLOT(event_elapsed), {"cuEventElapsedTime_v2", "cuEventElapsedTime"}},
	{SLOT(pointer_attr), {"cuPointerGetAttribute", NULL}},
	{SLOT(error_name), {"cuGetErrorName", NULL}},
	{SLOT(error_string), {"cuGetErrorString", NULL}},
};
#define NSYMS (sizeof(syms) / sizeof(syms[0]))
static const char *bound[NSYMS];

static pthread_mutex_t load_mu = PTHREAD_MUTEX_INITIALIZER;
static void *handle;

int gcu_load(const char *path, char *err, size_t errlen) {
	// Every candidate is opened and checked, also when a library is already bound, so that a bad path is
	// always reported; the first library bound stays for the life of the process.
	void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (h == NULL) {
		const char *e = dlerror();
		snprintf(err, errlen, "%s", e ? e : "dlopen failed");
		return -1;
	}
	void *fns[NSYMS];
	const char *names[NSYMS];
	for (size_t i = 0; i < NSYMS; i++) {
		fns[i] = NULL;
		names[i] = NULL;
		for (int k = 0; k < 2 && fns[i] == NULL && syms[i].names[k] != NULL; k++) {
			fns[i] = dlsym(h, syms[i].names[k]);
			names[i] = syms[i].names[k];
		}
		if (fns[i] == NULL) {
			snprintf(err, errlen, "does not export %s (not the NVIDIA driver's libcuda, or one too old)", syms[i].names[0]);
			dlclose(h);
			return -1;
		}
	}
	pthread_mutex_lock(&load_mu);
	if (handle == NULL) {
		for (size_t i = 0; i < NSYMS; i++) {
			*syms[i].slot = fns[i];
			bound[i] = names[i];
		}
		__atomic_store_n(&handle, h, __ATOMIC_RELEASE);
		h = NULL;
	}
	pthread_mutex_unlock(&load_mu);
	if (h != NULL) {
		dlclose(h); // already bound to an earlier library; drop this reference
	}
	return 0;
}

int gcu_loaded(void) { return __atomic_load_n(&handle, __ATOMIC_ACQUIRE) != NULL; }

const char *gcu_symbol_name(int i) {
	if (i < 0 || (size_t)i >= NSYMS) {
		return NULL;
	}
	return bound[i];
}

gcu_result gcu_init(void) { return api.init(0); }
gcu_result gcu_driver_version(int *v) { return api.driver_version(v); }
gcu_result gcu_device_count(int *n) { return api.device_count(n); }
gcu_result gcu_device_get(int ordinal, gcu_device *d) { return api.device_get(d, ordinal); }
gcu_result gcu_device_name(gcu_device d, char *buf, int len) { return api.device_name(buf, len, d); }
gcu_result gcu_device_total_mem(gcu_device d, size_t *bytes) { return api.device_total_mem(bytes, d); }
gcu_result gcu_device_attrs(gcu_device d, const int *attrs, int *vals, int n) {
	for (int i = 0; i < n; i++) {
		gcu_result r = api.device_attr(&vals[i], attrs[i], d);
		if (r != 0) {
			return r;
		}
	}
	return 0;
}
gcu_result gcu_device_pci_bus_id(gcu_device d, char *buf, int len) { return api.device_pci_bus_id(buf, len, d); }
gcu_result gcu_device_uuid(gcu_device d, unsigned char out[16]) { return api.device_uuid(out, d); }
gcu_result gcu_primary_retain(gcu_device d, gcu_ctx *ctx) { void *c = NULL;
	gcu_result r = api.primary_retain(&c, d);
	*ctx = (gcu_ctx)c;
	return r; }
gcu_result gcu_primary_release(gcu_device d) { return api.primary_release(d); }

const char *gcu_error_name(gcu_result r) {
	const char *s = NULL;
	if (!gcu_loaded() || api.error_name(r, &s) != 0) {
		return NULL;
	}
	return s;
}
const char *gcu_error_string(gcu_result r) {
	const char *s = NULL;
	if (!gcu_loaded() || api.error_string(r, &s) != 0) {
		return NULL;
	}
	return s;
}

gcu_result gcu_bind(gcu_ctx ctx) { return api.ctx_set(H(ctx)); }

#define BIND(ctx)                          \
	do {                                   \
		gcu_result _r = api.ctx_set(H(ctx));  \
		if (_r != 0) {                     \
			return _r;                     \
		}                                  \
	} while (0)

gcu_result gcu_ctx_sync(gcu_ctx ctx) {
	BIND(ctx);
	return api.ctx_sync();
}
gcu_result gcu_mem_info(gcu_ctx ctx, size_t *free_b, size_t *total_b) {
	BIND(ctx);
	return api.mem_info(free_b, total_b);
}
gcu_result gcu_mem_alloc(gcu_ctx ctx, gcu_dptr *p, size_t n) {
	BIND(ctx);
	return api.mem_alloc(p, n);
}
gcu_result gcu_mem_free(gcu_ctx ctx, gcu_dptr p) {
	BIND(ctx);
	return api.mem_free(p);
}
gcu_result gcu_host_alloc(gcu_ctx ctx, uintptr_t *p, size_t n, unsigned flags) {
	BIND(ctx);
	void *q = NULL;
	gcu_result r = api.host_alloc(&q, n, flags);
	*p = (uintptr_t)q;
	return r;
}
gcu_result gcu_host_free(gcu_ctx ctx, uintptr_t p) {
	BIND(ctx);
	return api.host_free((void *)p);
}
gcu_result gcu_host_register(gcu_ctx ctx, uintptr_t p, size_t n, unsigned flags) {
	BIND(ctx);
	return api.host_register((void *)p, n, flags);
}
gcu_result gcu_host_unregister(gcu_ctx ctx, uintptr_t p) {
	BIND(ctx);
	return api.host_unregister((void *)p);
}
gcu_result gcu_memset8(gcu_ctx ctx, gcu_dptr p, unsigned char v, size_t n) {
	BIND(ctx);
	return api.memset8(p, v, n);
}
gcu_result gcu_copy_sync(gcu_ctx ctx, int kind, uint64_t dst, uint64_t src, size_t n) {
	BIND(ctx);
	switch (kind) {
	case GCU_HTOD:
		return api.htod((gcu_dptr)dst, (const void *)(uintptr_t)src, n);
	case GCU_DTOH:
		return api.dtoh((void *)(uintptr_t)dst, (gcu_dptr)src, n);
	case GCU_DTOD:
		return api.dtod((gcu_dptr)dst, (gcu_dptr)src, n);
	}
	return 1; // CUDA_ERROR_INVALID_VALUE
}
gcu_result gcu_copy_htod_ptr(gcu_ctx ctx, gcu_dptr dst, const void *src, size_t n) {
	BIND(ctx);
	return api.htod(dst, src, n);
}
gcu_result gcu_copy_dtoh_ptr(gcu_ctx ctx, void *dst, gcu_dptr src, size_t n) {
	BIND(ctx);
	return api.dtoh(dst, src, n);
}
// cuMemcpyBatchAsync (CUDA 12.8+): the whole batch in one driver call. Resolved once, at first use, through
// cuGetProcAddress_v2 for the ABI of the driver's major version (CUDA 13 dropped the failIdx argument); NULL
// on older drivers, which keep the per-copy loop.
typedef struct {
	int type; // CUmemLocationType: 1 device, 2 host
	int id;
} gcu_mem_location;
typedef struct {
	int src_access_order; // CUmemcpySrcAccessOrder: 1 = stream order
	gcu_mem_location src_hint, dst_hint;
	unsigned int flags;
} gcu_memcpy_attrs;
typedef gcu_result (*fn_batch13)(gcu_dptr *, gcu_dptr *, size_t *, size_t, gcu_memcpy_attrs *, size_t *, size_t, void *);
typedef gcu_result (*fn_batch12)(gcu_dptr *, gcu_dptr *, size_t *, size_t, gcu_memcpy_attrs *, size_t *, size_t, size_t *, void *);
typedef gcu_result (*fn_get_proc)(const char *, void **, int, uint64_t, int *);
static pthread_once_t batch_once = PTHREAD_ONCE_INIT;
static void *batch_fn;
static int batch_abi; // 13, 12 or 0 (none)
static int batch_off;  // set when the driver refused a batch: the loop serves from then on

static void batch_resolve(void) {
	void *h = __atomic_load_n(&handle, __ATOMIC_ACQUIRE);
	if (h == NULL || getenv("GONIXL_CUDA_NO_BATCH") != NULL) return;
	fn_get_proc gp = (fn_get_proc)dlsym(h, "cuGetProcAddress_v2");
	int ver = 0;
	if (gp == NULL || api.driver_version(&ver) != 0) return;
	void *f = NULL;
	int st = 0;
	if (ver >= 13000 && gp("cuMemcpyBatchAsync", &f, 13000, 0, &st) == 0 && f != NULL) {
		batch_fn = f;
		batch_abi = 13;
	} else if (ver >= 12080 && gp("cuMemcpyBatchAsync", &f, 12080, 0, &st) == 0 && f != NULL) {
		batch_fn = f;
		batch_abi = 12;
	}
}

int gcu_batch_abi(void) {
	pthread_once(&batch_once, batch_resolve);
	return __atomic_load_n(&batch_off, __ATOMIC_RELAXED) ? 0 : batch_abi;
}

// batch_copy issues ops[0..n) in one cuMemcpyBatchAsync call; returns -1 when that is not possible here.
static gcu_result batch_copy(int kind, const gcu_copy *ops, size_t n, gcu_stream s, int dev) {
	if (gcu_batch_abi() == 0 || n < 2) return -1;
	// CU_STREAM_PER_THREAD for the legacy default stream, which the batch call refuses; the per-thread
	// stream synchronizes with the legacy one, so ordering is kept.
	void *stream = s ? H(s) : (void *)(uintptr_t)0x2;
	gcu_dptr *arr = malloc(n * (2 * sizeof(gcu_dptr) + sizeof(size_t)));
	if (arr == NULL) return -1;
	gcu_dptr *dsts = arr, *srcs = arr + n;
	size_t *sizes = (size_t *)(arr + 2 * n);
	for (size_t i = 0; i < n; i++) {
		dsts[i] = ops[i].dst;
		srcs[i] = ops[i].src;
		sizes[i] = ops[i].len;
	}
	gcu_mem_location host = {2, 0}, gpu = {1, dev};
	gcu_memcpy_attrs attr = {1, kind == GCU_HTOD ? host : gpu, kind == GCU_DTOH ? host : gpu, 0};
	size_t idx = 0, fail = 0;
	gcu_result r;
	if (batch_abi == 13) {
		r = ((fn_batch13)batch_fn)(dsts, srcs, sizes, n, &attr, &idx, 1, stream);
	} else {
		r = ((fn_batch12)batch_fn)(dsts, srcs, sizes, n, &attr, &idx, 1, &fail, stream);
	}
	free(arr);
	if (r == 1 /* CUDA_ERROR_INVALID_VALUE */ || r == 801 /* CUDA_ERROR_NOT_SUPPORTED */) {
		__atomic_store_n(&batch_off, 1, __ATOMIC_RELAXED); // this driver will not batch these: loop from now on
		return -1;
	}
	if (r == 0 && s == 0) r = api.stream_sync((void *)(uintptr_t)0x2);
	return r;
}

gcu_result gcu_copy_batch(gcu_ctx ctx, int kind, const gcu_copy *ops, size_t n, gcu_stream s, int sync, size_t *failed, int dev) {
	*failed = 0;
	BIND(ctx);
	if (kind >= GCU_HTOD && kind <= GCU_DTOD) {
		gcu_result r = batch_copy(kind, ops, n, s, dev);
		if (r > 0) {
			*failed = 0; // the batch failed as a whole
			return r;
		}
		if (r == 0) goto done;
	}
	for (size_t i = 0; i < n; i++) {
		gcu_result r;
		switch (kind) {
		case GCU_HTOD:
			r = api.htod_async((gcu_dptr)ops[i].dst, (const void *)(uintptr_t)ops[i].src, ops[i].len, H(s));
			break;
		case GCU_DTOH:
			r = api.dtoh_async((void *)(uintptr_t)ops[i].dst, (gcu_dptr)ops[i].src, ops[i].len, H(s));
			break;
		case GCU_DTOD:
			r = api.dtod_async((gcu_dptr)ops[i].dst, (gcu_dptr)ops[i].src, ops[i].len, H(s));
			break;
		default:
			r = 1;
		}
		if (r != 0) {
			*failed = i;
			return r;
		}
	}
done:
	if (sync) {
		gcu_result r = api.stream_sync(H(s));
		if (r != 0) {
			*failed = n;
			return r;
		}
	}
	return 0;
}
gcu_result gcu_stream_create(gcu_ctx ctx, gcu_stream *s, unsigned flags) {
	BIND(ctx);
	void *q = NULL;
	gcu_result r = api.stream_create(&q, flags);
	*s = (gcu_stream)q;
	return r;
}
gcu_result gcu_stream_destroy(gcu_ctx ctx, gcu_stream s) {
	BIND(ctx);
	return api.stream_destroy(H(s));
}
gcu_result gcu_stream_sync(gcu_ctx ctx, gcu_stream s) {
	BIND(ctx);
	return api.stream_sync(H(s));
}
gcu_result gcu_stream_query(gcu_ctx ctx, gcu_stream s) {
	BIND(ctx);
	return api.stream_query(H(s));
}
gcu_result gcu_stream_wait_event(gcu_ctx ctx, gcu_stream s, gcu_event e) {
	BIND(ctx);
	return api.stream_wait_event(H(s), H(e), 0);
}
gcu_result gcu_event_create(gcu_ctx ctx, gcu_event *e, unsigned flags) {
	BIND(ctx);
	void *q = NULL;
	gcu_result r = api.event_create(&q, flags);
	*e = (gcu_event)q;
	return r;
}
gcu_result gcu_event_destroy(gcu_ctx ctx, gcu_event e) {
	BIND(ctx);
	return api.event_destroy(H(e));
}
gcu_result gcu_event_record(gcu_ctx ctx, gcu_event e, gcu_stream s) {
	BIND(ctx);
	return api.event_record(H(e), H(s));
}
gcu_result gcu_event_sync(gcu_ctx ctx, gcu_event e) {
	BIND(ctx);
	return api.event_sync(H(e));
}
gcu_result gcu_event_query(gcu_ctx ctx, gcu_event e) {
	BIND(ctx);
	return api.event_query(H(e));
}
gcu_result gcu_event_elapsed(gcu_ctx ctx, float *ms, gcu_event start, gcu_event end) {
	BIND(ctx);
	return api.event_elapsed(ms, H(start), H(end));
}

// CUpointer_attribute values.
enum {
	PA_MEMORY_TYPE = 2,
	PA_DEVICE_POINTER = 3,
	PA_HOST_POINTER = 4,
	PA_IS_MANAGED = 8,
	PA_DEVICE_ORDINAL = 9,
	PA_RANGE_START_ADDR = 11,
	PA_RANGE_SIZE = 12,
	PA_MAPPED = 13,
};

gcu_result gcu_pointer_info(gcu_ctx ctx, uint64_t p, gcu_ptr_info *out) {
	memset(out, 0, sizeof(*out));
	out->ordinal = -1;
	BIND(ctx);
	// The memory type decides whether the driver knows the pointer at all; the other attributes are
	// best-effort (some do not apply to every kind of memory) and stay zero (ordinal -1) when refused.
	gcu_result r = api.pointer_attr(&out->mem_type, PA_MEMORY_TYPE, (gcu_dptr)p);
	if (r != 0) {
		return r;
	}
	int ord = -1;
	if (api.pointer_attr(&ord, PA_DEVICE_ORDINAL, (gcu_dptr)p) == 0) {
		out->ordinal = ord;
	}
	unsigned int b = 0;
	if (api.pointer_attr(&b, PA_IS_MANAGED, (gcu_dptr)p) == 0) {
		out->is_managed = b != 0;
	}
	b = 0;
	if (api.pointer_attr(&b, PA_MAPPED, (gcu_dptr)p) == 0) {
		out->mapped = b != 0;
	}
	gcu_dptr v = 0;
	if (api.pointer_attr(&v, PA_RANGE_START_ADDR, (gcu_dptr)p) == 0) {
		out->range_start = v;
	}
	size_t sz = 0;
	if (api.pointer_attr(&sz, PA_RANGE_SIZE, (gcu_dptr)p) == 0) {
		out->range_size = sz;
	}
	v = 0;
	if (api.pointer_attr(&v, PA_DEVICE_POINTER, (gcu_dptr)p) == 0) {
		out->dev_ptr = v;
	}
	void *hp = NULL;
	if (api.pointer_attr(&hp, PA_HOST_POINTER, (gcu_dptr)p) == 0) {
		out->host_ptr = (uint64_t)(uintptr_t)hp;
	}
	return 0;
}
