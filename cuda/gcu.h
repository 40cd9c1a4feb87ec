// gcu: the CUDA driver API as gonixl's cuda package uses it. libcuda.so.1 is loaded with dlopen, so no CUDA
// toolkit (and no cuda.h) is needed to build; the prototypes below are declared here, from the driver API's
// documented signatures. Every entry point that touches device state takes the CUcontext to bind first
// (cuCtxSetCurrent) inside the same C call, so a goroutine that migrates between OS threads never runs a
// driver call without the right context.
#ifndef GONIXL_GCU_H
#define GONIXL_GCU_H

#include <stddef.h>
#include <stdint.h>

typedef int gcu_result;            // CUresult
typedef int gcu_device;            // CUdevice
typedef uintptr_t gcu_ctx;         // CUcontext (an address owned by the driver)
typedef unsigned long long gcu_dptr; // CUdeviceptr
typedef uintptr_t gcu_stream;      // CUstream (0 = the legacy default stream)
typedef uintptr_t gcu_event;       // CUevent

// One copy of a batch: len bytes from src to dst. Addresses are host or device pointers by the batch kind.
typedef struct {
	uint64_t dst, src, len;
} gcu_copy;

enum { GCU_HTOD = 0, GCU_DTOH = 1, GCU_DTOD = 2 };

// Loading. gcu_load returns 0 on success; otherwise it writes a reason into err (dlopen's message or the
// first missing symbol) and returns -1. Loading twice is harmless; the first loaded library stays.
int gcu_load(const char *path, char *err, size_t errlen);
int gcu_loaded(void);
const char *gcu_symbol_name(int i); // the symbol bound for function slot i, or NULL past the end

// Results outside a context.
gcu_result gcu_init(void);
gcu_result gcu_driver_version(int *v);
gcu_result gcu_device_count(int *n);
gcu_result gcu_device_get(int ordinal, gcu_device *d);
gcu_result gcu_device_name(gcu_device d, char *buf, int len);
gcu_result gcu_device_total_mem(gcu_device d, size_t *bytes);
gcu_result gcu_device_attrs(gcu_device d, const int *attrs, int *vals, int n);
gcu_result gcu_device_pci_bus_id(gcu_device d, char *buf, int len);
gcu_result gcu_device_uuid(gcu_device d, unsigned char out[16]);
gcu_result gcu_primary_retain(gcu_device d, gcu_ctx *ctx);
gcu_result gcu_primary_release(gcu_device d);
const char *gcu_error_name(gcu_result r);
const char *gcu_error_string(gcu_result r);

// Results inside ctx (each binds ctx to the calling thread first).
gcu_result gcu_bind(gcu_ctx ctx);
gcu_result gcu_ctx_sync(gcu_ctx ctx);
gcu_result gcu_mem_info(gcu_ctx ctx, size_t *free_b, size_t *total_b);
gcu_result gcu_mem_alloc(gcu_ctx ctx, gcu_dptr *p, size_t n);
gcu_result gcu_mem_free(gcu_ctx ctx, gcu_dptr p);
gcu_result gcu_host_alloc(gcu_ctx ctx, uintptr_t *p, size_t n, unsigned flags);
gcu_result gcu_host_free(gcu_ctx ctx, uintptr_t p);
gcu_result gcu_host_register(gcu_ctx ctx, uintptr_t p, size_t n, unsigned flags);
gcu_result gcu_host_unregister(gcu_ctx ctx, uintptr_t p);
gcu_result gcu_memset8(gcu_ctx ctx, gcu_dptr p, unsigned char v, size_t n);
gcu_result gcu_copy_sync(gcu_ctx ctx, int kind, uint64_t dst, uint64_t src, size_t n);
// Synchronous copies to or from a caller's buffer (e.g. Go memory, valid for the duration of the call).
gcu_result gcu_copy_htod_ptr(gcu_ctx ctx, gcu_dptr dst, const void *src, size_t n);
gcu_result gcu_copy_dtoh_ptr(gcu_ctx ctx, void *dst, gcu_dptr src, size_t n);
// gcu_copy_batch issues n async copies of one kind on stream (NULL = the legacy default stream) and, if sync,
// waits for the stream. On failure *failed is the index of the copy that failed (n if the wait failed).
gcu_result gcu_copy_batch(gcu_ctx ctx, int kind, const gcu_copy *ops, size_t n, gcu_stream s, int sync, size_t *failed, int dev);
// gcu_batch_abi: 13 or 12 when gcu_copy_batch issues one cuMemcpyBatchAsync call (that ABI), 0 when it loops.
int gcu_batch_abi(void);
gcu_result gcu_stream_create(gcu_ctx ctx, gcu_stream *s, unsigned flags);
gcu_result gcu_stream_destroy(gcu_ctx ctx, gcu_stream s);
gcu_result gcu_stream_sync(gcu_ctx ctx, gcu_stream s);
gcu_result gcu_stream_query(gcu_ctx ctx, gcu_stream s);
gcu_result gcu_stream_wait_event(gcu_ctx ctx, gcu_stream s, gcu_event e);
gcu_result gcu_event_create(gcu_ctx ctx, gcu_event *e, unsigned flags);
gcu_result gcu_event_destroy(gcu_ctx ctx, gcu_event e);
gcu_result gcu_event_record(gcu_ctx ctx, gcu_event e, gcu_stream s);
gcu_result gcu_event_sync(gcu_ctx ctx, gcu_event e);
gcu_result gcu_event_query(gcu_ctx ctx, gcu_event e);
gcu_result gcu_event_elapsed(gcu_ctx ctx, float *ms, gcu_event start, gcu_event end);
// Pointer attributes: memory type, device ordinal, is-managed, range start, range size, mapped, device pointer, host pointer.
typedef struct {
	unsigned int mem_type;
	int ordinal;
	int is_managed;
	int mapped;
	uint64_t range_start, range_size, dev_ptr, host_ptr;
} gcu_ptr_info;
gcu_result gcu_pointer_info(gcu_ctx ctx, uint64_t p, gcu_ptr_info *out);

#endif
