/*
 * fakenrt — a stand-in for the Neuron runtime library (libnrt.so.1) used by gonixl's tests and by the demo
 * on machines without Trainium/Inferentia. It implements the part of the libnrt C API that package neuron
 * uses, over ordinary host memory, with DMA-like constraints, counters and fault injection.
 *
 * It is compiled by neurontest.Build with the system C compiler into a temporary folder and then loaded
 * through the very same dlopen path as the real library. It needs no Neuron SDK: every type below is
 * declared here from the public ABI description (plain C, LP64).
 *
 * Behaviour knobs, read from the environment at nrt_init (and settable at any time via fake_nrt_ctl):
 *   FAKE_NRT_NUM_CORES       NeuronCores ("devices") visible, default 2
 *   FAKE_NRT_DEVICE_BYTES    device memory per core in bytes, default 4 GiB ("short device": make it small)
 *   FAKE_NRT_ALIGN           required alignment of offsets and host buffers, default 1
 *   FAKE_NRT_GRANULARITY     required multiple of every transfer size, default 1
 *   FAKE_NRT_MAX_XFER        largest single transfer in bytes, 0 = unlimited (default)
 *   FAKE_NRT_FAIL_READ       fail the k-th read operation (1-based, counted since init), 0 = never
 *   FAKE_NRT_FAIL_WRITE      fail the k-th write operation, 0 = never
 *   FAKE_NRT_FAIL_ALLOC      fail the k-th tensor allocation with NRT_RESOURCE, 0 = never
 *   FAKE_NRT_FAIL_STATUS     status returned by injected read/write faults, default 5 (NRT_TIMEOUT)
 *   FAKE_NRT_READ_DELAY_US   sleep this long in every read operation (latency model), default 0
 *   FAKE_NRT_VERSION         runtime version reported by nrt_get_version, "major.minor.patch", default 2.31.24
 * Compile with -DFAKE_NRT_OLD_RUNTIME to leave out the optional symbols (batch reads/writes,
 * nrt_get_status_as_str), like a runtime older than 2026.
 */
#include <errno.h>
#include <stdio.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int32_t NRT_STATUS;

enum {
	NRT_SUCCESS = 0,
	NRT_FAILURE = 1,
	NRT_INVALID = 2,
	NRT_INVALID_HANDLE = 3,
	NRT_RESOURCE = 4,
	NRT_TIMEOUT = 5,
	NRT_UNINITIALIZED = 13,
	NRT_CLOSED = 14,
};

enum { PLACEMENT_DEVICE = 0, PLACEMENT_HOST = 1, PLACEMENT_VIRTUAL = 2 };
enum { FW_NO_FW = 1, FW_PRECHECK = 5 };

#define FAKE_MAGIC 0x6e72747473726f66ULL
#define MAX_CORES 64
#define HOST_PLACEMENT_LIMIT (4u << 20)

typedef struct nrt_tensor {
	uint64_t magic;
	int placement;
	int vnc;
	size_t size;
	unsigned char *data;
	char name[64];
	struct nrt_tensor *next;
} nrt_tensor_t;

typedef struct {
	uint64_t offset;
	uint64_t size;
	void *buffer;
} nrt_tensor_batch_op_t;

typedef struct {
	const nrt_tensor_t *tensor;
	const nrt_tensor_batch_op_t *ops;
	uint32_t num_ops;
} nrt_tensor_batch_t;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int state; /* 0 never initialised, 1 initialised, 2 closed */
static nrt_tensor_t *live_list;

/* knobs */
static int64_t num_cores = 2;
static int64_t device_bytes = (int64_t)4 << 30;
static int64_t align_req = 1, granularity = 1, max_xfer;
static int64_t fail_read_at, fail_write_at, fail_alloc_at, fail_status = NRT_TIMEOUT, read_delay_us;

/* counters */
static int64_t used_bytes[MAX_CORES];
static int64_t n_reads, n_read_bytes, n_writes, n_write_bytes, n_batch_calls, n_allocs, n_frees, n_live,
	n_leaked_at_close, n_inits, n_closes, n_constraint_violations;

static int64_t env_int(const char *name, int64_t def) {
	const char *v = getenv(name);
	if (v == NULL || *v == 0)
		return def;
	char *end = NULL;
	long long x = strtoll(v, &end, 0);
	if (end == v)
		return def;
	return (int64_t)x;
}

static void read_env(void) {
	num_cores = env_int("FAKE_NRT_NUM_CORES", 2);
	if (num_cores < 0)
		num_cores = 0;
	if (num_cores > MAX_CORES)
		num_cores = MAX_CORES;
	device_bytes = env_int("FAKE_NRT_DEVICE_BYTES", (int64_t)4 << 30);
	align_req = env_int("FAKE_NRT_ALIGN", 1);
	granularity = env_int("FAKE_NRT_GRANULARITY", 1);
	max_xfer = env_int("FAKE_NRT_MAX_XFER", 0);
	fail_read_at = env_int("FAKE_NRT_FAIL_READ", 0);
	fail_write_at = env_int("FAKE_NRT_FAIL_WRITE", 0);
	fail_alloc_at = env_int("FAKE_NRT_FAIL_ALLOC", 0);
	fail_status = env_int("FAKE_NRT_FAIL_STATUS", NRT_TIMEOUT);
	read_delay_us = env_int("FAKE_NRT_READ_DELAY_US", 0);
	if (align_req < 1)
		align_req = 1;
	if (granularity < 1)
		granularity = 1;
}

static bool live(const nrt_tensor_t *t) {
	for (nrt_tensor_t *p = live_list; p != NULL; p = p->next)
		if (p == t)
			return p->magic == FAKE_MAGIC;
	return false;
}

/* Validates a transfer under mu and counts it; returns NRT_SUCCESS or the status to return. */
static NRT_STATUS check_xfer(const nrt_tensor_t *t, const void *buf, uint64_t off, uint64_t size, bool is_read) {
	if (state == 0)
		return NRT_UNINITIALIZED;
	if (state == 2)
		return NRT_CLOSED;
	if (t == NULL || !live(t))
		return NRT_INVALID_HANDLE;
	if (buf == NULL && size > 0)
		return NRT_INVALID;
	if (off > t->size || size > t->size - off)
		return NRT_INVALID;
	if (off % (uint64_t)align_req != 0 || ((uintptr_t)buf) % (uintptr_t)align_req != 0 ||
	    size % (uint64_t)granularity != 0 || (max_xfer > 0 && size > (uint64_t)max_xfer)) {
		n_constraint_violations++;
		return NRT_INVALID;
	}
	if (is_read) {
		n_reads++;
		if (fail_read_at > 0 && n_reads == fail_read_at)
			return (NRT_STATUS)fail_status;
		n_read_bytes += (int64_t)size;
	} else {
		n_writes++;
		if (fail_write_at > 0 && n_writes == fail_write_at)
			return (NRT_STATUS)fail_status;
		n_write_bytes += (int64_t)size;
	}
	return NRT_SUCCESS;
}

static void delay(void) {
	if (read_delay_us <= 0)
		return;
	struct timespec ts = {read_delay_us / 1000000, (read_delay_us % 1000000) * 1000};
	while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
	}
}

NRT_STATUS nrt_init(int32_t framework, const char *fw_version, const char *fal_version) {
	(void)fw_version;
	(void)fal_version;
	if (framework != FW_NO_FW && framework != FW_PRECHECK && (framework < 2 || framework > 4))
		return NRT_INVALID;
	pthread_mutex_lock(&mu);
	if (state == 1) {
		pthread_mutex_unlock(&mu);
		return NRT_FAILURE;
	}
	read_env();
	memset(used_bytes, 0, sizeof used_bytes);
	n_reads = n_read_bytes = n_writes = n_write_bytes = n_batch_calls = 0;
	n_allocs = n_frees = n_live = n_leaked_at_close = n_constraint_violations = 0;
	n_inits++;
	state = 1;
	pthread_mutex_unlock(&mu);
	return NRT_SUCCESS;
}

void nrt_close(void) {
	pthread_mutex_lock(&mu);
	if (state == 1) {
		nrt_tensor_t *p = live_list;
		while (p != NULL) {
			nrt_tensor_t *next = p->next;
			n_leaked_at_close++;
			p->magic = 0;
			free(p->data);
			free(p);
			p = next;
		}
		live_list = NULL;
		n_live = 0;
		n_closes++;
		state = 2;
	}
	pthread_mutex_unlock(&mu);
}

static NRT_STATUS nc_count(uint32_t *n) {
	if (n == NULL)
		return NRT_INVALID;
	pthread_mutex_lock(&mu);
	if (state != 1)
		read_env(); /* callable before nrt_init, like the real runtime */
	*n = (uint32_t)num_cores;
	pthread_mutex_unlock(&mu);
	return NRT_SUCCESS;
}

NRT_STATUS nrt_get_total_nc_count(uint32_t *n) { return nc_count(n); }
NRT_STATUS nrt_get_visible_nc_count(uint32_t *n) { return nc_count(n); }
NRT_STATUS nrt_get_total_vnc_count(uint32_t *n) { return nc_count(n); }
NRT_STATUS nrt_get_visible_vnc_count(uint32_t *n) { return nc_count(n); }

NRT_STATUS nrt_tensor_allocate(int32_t placement, int vnc, size_t size, const char *name, nrt_tensor_t **tensor) {
	if (tensor == NULL)
		return NRT_INVALID;
	pthread_mutex_lock(&mu);
	NRT_STATUS st = NRT_SUCCESS;
	if (state != 1) {
		st = state == 0 ? NRT_UNINITIALIZED : NRT_CLOSED;
		goto out;
	}
	if (placement < PLACEMENT_DEVICE || placement > PLACEMENT_VIRTUAL || size == 0) {
		st = NRT_INVALID;
		goto out;
	}
	if (placement == PLACEMENT_DEVICE && (vnc < 0 || vnc >= num_cores)) {
		st = NRT_INVALID;
		goto out;
	}
	if (placement == PLACEMENT_HOST && size >= HOST_PLACEMENT_LIMIT) {
		st = NRT_RESOURCE;
		goto out;
	}
	n_allocs++;
	if (fail_alloc_at > 0 && n_allocs == fail_alloc_at) {
		st = NRT_RESOURCE;
		goto out;
	}
	if (placement == PLACEMENT_DEVICE && (int64_t)size > device_bytes - used_bytes[vnc]) {
		st = NRT_RESOURCE;
		goto out;
	}
	nrt_tensor_t *t = calloc(1, sizeof *t);
	unsigned char *data = t ? malloc(size) : NULL;
	if (data == NULL) {
		free(t);
		st = NRT_RESOURCE;
		goto out;
	}
	/* Device memory is not zeroed: fill it with a recognisable pattern. */
	memset(data, 0xCD, size);
	t->magic = FAKE_MAGIC;
	t->placement = placement;
	t->vnc = placement == PLACEMENT_DEVICE ? vnc : -1;
	t->size = size;
	t->data = data;
	if (name != NULL) {
		strncpy(t->name, name, sizeof t->name - 1);
	}
	t->next = live_list;
	live_list = t;
	if (placement == PLACEMENT_DEVICE)
		used_bytes[vnc] += (int64_t)size;
	n_live++;
	*tensor = t;
out:
	pthread_mutex_unlock(&mu);
	return st;
}

void nrt_tensor_free(nrt_tensor_t **tensor) {
	if (tensor == NULL || *tensor == NULL)
		return;
	pthread_mutex_lock(&mu);
	nrt_tensor_t *t = *tensor;
	nrt_tensor_t **pp = &live_list;
	while (*pp != NULL && *pp != t)
		pp = &(*pp)->next;
	if (*pp == t) {
		*pp = t->next;
		if (t->placement == PLACEMENT_DEVICE && t->vnc >= 0)
			used_bytes[t->vnc] -= (int64_t)t->size;
		t->magic = 0;
		free(t->data);
		free(t);
		n_frees++;
		n_live--;
	}
	*tensor = NULL;
	pthread_mutex_unlock(&mu);
}

size_t nrt_tensor_get_size(const nrt_tensor_t *t) {
	size_t n = 0;
	pthread_mutex_lock(&mu);
	if (t != NULL && live(t))
		n = t->size;
	pthread_mutex_unlock(&mu);
	return n;
}

void *nrt_tensor_get_va(const nrt_tensor_t *t) {
	void *va = NULL;
	pthread_mutex_lock(&mu);
	if (t != NULL && live(t))
		va = t->data;
	pthread_mutex_unlock(&mu);
	return va;
}

/* The copies run outside mu (like DMA engines working in parallel); freeing a tensor while it is being
 * read is a caller bug, as with the real runtime. */
NRT_STATUS nrt_tensor_read(const nrt_tensor_t *t, void *buf, size_t offset, size_t size) {
	pthread_mutex_lock(&mu);
	NRT_STATUS st = check_xfer(t, buf, offset, size, true);
	pthread_mutex_unlock(&mu);
	if (st != NRT_SUCCESS)
		return st;
	delay();
	memcpy(buf, t->data + offset, size);
	return NRT_SUCCESS;
}

NRT_STATUS nrt_tensor_write(nrt_tensor_t *t, const void *buf, size_t offset, size_t size) {
	pthread_mutex_lock(&mu);
	NRT_STATUS st = check_xfer(t, buf, offset, size, false);
	pthread_mutex_unlock(&mu);
	if (st != NRT_SUCCESS)
		return st;
	memcpy(t->data + offset, buf, size);
	return NRT_SUCCESS;
}

NRT_STATUS nrt_tensor_copy(const nrt_tensor_t *src, size_t src_off, nrt_tensor_t *dst, size_t dst_off, size_t size) {
	pthread_mutex_lock(&mu);
	NRT_STATUS st = NRT_SUCCESS;
	if (state != 1)
		st = state == 0 ? NRT_UNINITIALIZED : NRT_CLOSED;
	else if (!live(src) || !live(dst))
		st = NRT_INVALID_HANDLE;
	else if (src_off > src->size || size > src->size - src_off || dst_off > dst->size || size > dst->size - dst_off ||
		 src->vnc != dst->vnc)
		st = NRT_INVALID;
	pthread_mutex_unlock(&mu);
	if (st == NRT_SUCCESS)
		memmove(dst->data + dst_off, src->data + src_off, size);
	return st;
}

#ifndef FAKE_NRT_OLD_RUNTIME
static NRT_STATUS batch(const nrt_tensor_batch_t *batches, uint64_t num_batches, bool is_read) {
	if (batches == NULL && num_batches > 0)
		return NRT_INVALID;
	pthread_mutex_lock(&mu);
	n_batch_calls++;
	pthread_mutex_unlock(&mu);
	for (uint64_t i = 0; i < num_batches; i++) {
		const nrt_tensor_batch_t *b = &batches[i];
		for (uint32_t j = 0; j < b->num_ops; j++) {
			const nrt_tensor_batch_op_t *op = &b->ops[j];
			NRT_STATUS st = is_read ? nrt_tensor_read(b->tensor, op->buffer, op->offset, op->size)
						: nrt_tensor_write((nrt_tensor_t *)b->tensor, op->buffer, op->offset, op->size);
			if (st != NRT_SUCCESS)
				return st;
		}
	}
	return NRT_SUCCESS;
}

NRT_STATUS nrt_tensor_read_batch(const nrt_tensor_batch_t *batches, uint64_t num_batches, bool unsafe) {
	(void)unsafe;
	return batch(batches, num_batches, true);
}

NRT_STATUS nrt_tensor_write_batch(const nrt_tensor_batch_t *batches, uint64_t num_batches, bool unsafe) {
	(void)unsafe;
	return batch(batches, num_batches, false);
}

const char *nrt_get_status_as_str(NRT_STATUS s) {
	switch (s) {
	case NRT_SUCCESS: return "NRT_SUCCESS (fake)";
	case NRT_FAILURE: return "NRT_FAILURE (fake)";
	case NRT_INVALID: return "NRT_INVALID (fake)";
	case NRT_INVALID_HANDLE: return "NRT_INVALID_HANDLE (fake)";
	case NRT_RESOURCE: return "NRT_RESOURCE (fake)";
	case NRT_TIMEOUT: return "NRT_TIMEOUT (fake)";
	case NRT_UNINITIALIZED: return "NRT_UNINITIALIZED (fake)";
	case NRT_CLOSED: return "NRT_CLOSED (fake)";
	default: return "unknown status (fake)";
	}
}
#endif

typedef struct {
	uint64_t major, minor, patch, maintenance;
	char rt_detail[128];
	char git_hash[64];
} nrt_version_t;

NRT_STATUS nrt_get_version(nrt_version_t *v, size_t size) {
	if (v == NULL || size < sizeof(nrt_version_t))
		return NRT_INVALID;
	memset(v, 0, sizeof *v);
	v->major = 2;
	v->minor = 31;
	v->patch = 24;
	const char *env = getenv("FAKE_NRT_VERSION");
	if (env != NULL && *env != 0) {
		unsigned long long a = 0, b = 0, c = 0;
		if (sscanf(env, "%llu.%llu.%llu", &a, &b, &c) >= 2) {
			v->major = a;
			v->minor = b;
			v->patch = c;
		}
	}
	strncpy(v->rt_detail, "gonixl fake libnrt", sizeof v->rt_detail - 1);
	strncpy(v->git_hash, "fake", sizeof v->git_hash - 1);
	return NRT_SUCCESS;
}

/* Test control: fake_nrt_ctl(key, value, set) returns the current value of a knob or counter and, when
 * set != 0, first stores value into a knob (counters are read-only). Unknown keys return -1. */
int64_t fake_nrt_ctl(const char *key, int64_t value, int set) {
	static const struct {
		const char *name;
		int64_t *p;
		bool writable;
	} table[] = {
		{"num_cores", &num_cores, true},
		{"device_bytes", &device_bytes, true},
		{"align", &align_req, true},
		{"granularity", &granularity, true},
		{"max_xfer", &max_xfer, true},
		{"fail_read", &fail_read_at, true},
		{"fail_write", &fail_write_at, true},
		{"fail_alloc", &fail_alloc_at, true},
		{"fail_status", &fail_status, true},
		{"read_delay_us", &read_delay_us, true},
		{"reads", &n_reads, false},
		{"read_bytes", &n_read_bytes, false},
		{"writes", &n_writes, false},
		{"write_bytes", &n_write_bytes, false},
		{"batch_calls", &n_batch_calls, false},
		{"allocs", &n_allocs, false},
		{"frees", &n_frees, false},
		{"live", &n_live, false},
		{"leaked_at_close", &n_leaked_at_close, false},
		{"inits", &n_inits, false},
		{"closes", &n_closes, false},
		{"constraint_violations", &n_constraint_violations, false},
	};
	if (key == NULL)
		return -1;
	int64_t out = -1;
	pthread_mutex_lock(&mu);
	for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
		if (strcmp(table[i].name, key) == 0) {
			if (set && table[i].writable) {
				*table[i].p = value;
				if (align_req < 1)
					align_req = 1;
				if (granularity < 1)
					granularity = 1;
				if (num_cores < 0)
					num_cores = 0;
				if (num_cores > MAX_CORES)
					num_cores = MAX_CORES;
			}
			out = *table[i].p;
			break;
		}
	}
	pthread_mutex_unlock(&mu);
	return out;
}
