// gn: libnrt (the Neuron runtime) as gonixl's neuron package uses it. libnrt.so.1 is loaded with dlopen, so no
// Neuron SDK (and no nrt.h) is needed to build; the prototypes in gn.c are declared by hand from the public ABI
// (LP64: size_t = u64, enums and NRT_STATUS = i32, handles are opaque pointers).
#ifndef GONIXL_GN_H
#define GONIXL_GN_H

#include <stdbool.h>
#include <stdint.h>
#include <stddef.h>

typedef struct gn_lib gn_lib;       // a dlopen handle
typedef struct gn_tensor gn_tensor; // nrt_tensor_t
typedef void *gn_fn;                // a libnrt function resolved by gn_dlsym

// nrt_version_t (nrt_version.h): 4 × u64, char rt_detail[128], char git_hash[64] = 224 bytes.
typedef struct { uint64_t major, minor, patch, maintenance; char rt_detail[128]; char git_hash[64]; } gn_version;

// nrt_tensor_batch_op_t and nrt_tensor_batch_t (ndl/neuron_driver_shared_tensor_batch_op.h, nrt.h).
typedef struct { uint64_t offset; uint64_t size; void *buffer; } gn_op;
typedef struct { const gn_tensor *tensor; const gn_op *ops; uint32_t num_ops; } gn_batch;

// gn_dlopen returns the library, or NULL with *err a malloc'ed dlerror() (or NULL) for the caller to free.
gn_lib *gn_dlopen(const char *path, char **err);
gn_fn gn_dlsym(gn_lib *h, const char *name);

// Each gn_call_* calls the libnrt function f (resolved by the caller, never NULL) with its own prototype.
int32_t gn_call_init(gn_fn f, int32_t framework);                 // nrt_init(framework, "", "")
void gn_call_close(gn_fn f);                                      // nrt_close
int32_t gn_call_count(gn_fn f, uint32_t *n);                      // nrt_get_{visible,total}_{vnc,nc}_count
int32_t gn_call_alloc(gn_fn f, int32_t placement, int vnc, size_t size, const char *name, gn_tensor **t);
void gn_call_free(gn_fn f, gn_tensor *t);                         // nrt_tensor_free(&t)
size_t gn_call_size(gn_fn f, const gn_tensor *t);                 // nrt_tensor_get_size
void *gn_call_va(gn_fn f, const gn_tensor *t);                    // nrt_tensor_get_va
const char *gn_call_str(gn_fn f, int32_t status);                 // nrt_get_status_as_str
int64_t gn_call_ctl(gn_fn f, const char *key, int64_t v, int set); // fake_nrt_ctl (the fake libnrt only)
int32_t gn_call_version(gn_fn f, gn_version *v);                  // nrt_get_version(v, sizeof *v)

// gn_xfer moves every op of every batch in one cgo call: through nrt_tensor_{read,write}_batch when the
// runtime has it (batch_fn != NULL), else op by op with one_fn (nrt_tensor_{read,write}). On failure
// *failed_batch/*failed_op name the failing op when known (-1 otherwise).
int32_t gn_xfer(gn_fn one_fn, gn_fn batch_fn, int is_read, const gn_batch *b, uint64_t nb, int64_t *failed_batch,
		int64_t *failed_op);

#endif
