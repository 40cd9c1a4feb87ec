// gn.c: see gn.h. The libnrt prototypes, declared by hand from the public ABI.
#include "gn.h"

#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

typedef int32_t (*gn_init_t)(int32_t framework, const char *fw_version, const char *fal_version);
typedef void (*gn_close_t)(void);
typedef int32_t (*gn_count_t)(uint32_t *n);
typedef int32_t (*gn_alloc_t)(int32_t placement, int vnc, size_t size, const char *name, void **tensor);
typedef void (*gn_free_t)(void **tensor);
typedef int32_t (*gn_read_t)(const void *tensor, void *buf, size_t offset, size_t size);
typedef int32_t (*gn_write_t)(void *tensor, const void *buf, size_t offset, size_t size);
typedef size_t (*gn_size_t)(const void *tensor);
typedef void *(*gn_va_t)(const void *tensor);
typedef const char *(*gn_str_t)(int32_t status);
typedef int64_t (*gn_ctl_t)(const char *key, int64_t value, int set);
typedef int32_t (*gn_version_t)(gn_version *v, size_t size);
typedef int32_t (*gn_batch_t)(const gn_batch *batches, uint64_t num_batches, bool unsafe);

gn_lib *gn_dlopen(const char *path, char **err) {
	void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (h == NULL) {
		const char *e = dlerror();
		*err = e != NULL ? strdup(e) : NULL;
	}
	return (gn_lib *)h;
}

gn_fn gn_dlsym(gn_lib *h, const char *name) { return dlsym((void *)h, name); }

int32_t gn_call_init(gn_fn f, int32_t fw) { return ((gn_init_t)f)(fw, "", ""); }
void gn_call_close(gn_fn f) { ((gn_close_t)f)(); }
int32_t gn_call_count(gn_fn f, uint32_t *n) { return ((gn_count_t)f)(n); }
int32_t gn_call_alloc(gn_fn f, int32_t placement, int vnc, size_t size, const char *name, gn_tensor **t) {
	return ((gn_alloc_t)f)(placement, vnc, size, name, (void **)t);
}
void gn_call_free(gn_fn f, gn_tensor *t) {
	void *p = t;
	((gn_free_t)f)(&p);
}
size_t gn_call_size(gn_fn f, const gn_tensor *t) { return ((gn_size_t)f)(t); }
void *gn_call_va(gn_fn f, const gn_tensor *t) { return ((gn_va_t)f)(t); }
const char *gn_call_str(gn_fn f, int32_t st) { return ((gn_str_t)f)(st); }
int64_t gn_call_ctl(gn_fn f, const char *key, int64_t v, int set) { return ((gn_ctl_t)f)(key, v, set); }
int32_t gn_call_version(gn_fn f, gn_version *v) { return ((gn_version_t)f)(v, sizeof *v); }

int32_t gn_xfer(gn_fn one_fn, gn_fn batch_fn, int is_read, const gn_batch *b, uint64_t nb, int64_t *failed_batch,
		int64_t *failed_op) {
	*failed_batch = -1;
	*failed_op = -1;
	if (batch_fn != NULL) {
		return ((gn_batch_t)batch_fn)(b, nb, false);
	}
	for (uint64_t i = 0; i < nb; i++) {
		for (uint32_t j = 0; j < b[i].num_ops; j++) {
			const gn_op *op = &b[i].ops[j];
			int32_t st = is_read ? ((gn_read_t)one_fn)(b[i].tensor, op->buffer, op->offset, op->size)
					     : ((gn_write_t)one_fn)((void *)b[i].tensor, op->buffer, op->offset, op->size);
			if (st != 0) {
				*failed_batch = (int64_t)i;
				*failed_op = (int64_t)j;
				return st;
			}
		}
	}
	return 0;
}
