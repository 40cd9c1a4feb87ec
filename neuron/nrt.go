package neuron

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

// Prototypes of the libnrt functions used here, declared by hand from the public ABI (LP64: size_t = u64,
// enums and NRT_STATUS = i32, handles are opaque pointers). No Neuron SDK header is needed.
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
// nrt_version_t (nrt_version.h): 4 × u64, char rt_detail[128], char git_hash[64] = 224 bytes.
typedef struct { uint64_t major, minor, patch, maintenance; char rt_detail[128]; char git_hash[64]; } gn_version;
typedef int32_t (*gn_version_t)(gn_version *v, size_t size);
static int32_t gn_call_version(void *f, gn_version *v) { return ((gn_version_t)f)(v, sizeof *v); }

// nrt_tensor_batch_op_t and nrt_tensor_batch_t (ndl/neuron_driver_shared_tensor_batch_op.h, nrt.h).
typedef struct { uint64_t offset; uint64_t size; void *buffer; } gn_op;
typedef struct { const void *tensor; const gn_op *ops; uint32_t num_ops; } gn_batch;
typedef int32_t (*gn_batch_t)(const gn_batch *batches, uint64_t num_batches, bool unsafe);

static void *gn_dlopen(const char *path, char **err) {
	void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (h == NULL) {
		const char *e = dlerror();
		*err = e != NULL ? strdup(e) : NULL;
	}
	return h;
}

static void *gn_dlsym(void *h, const char *name) { return dlsym(h, name); }

static int32_t gn_call_init(void *f, int32_t fw) { return ((gn_init_t)f)(fw, "", ""); }
static void gn_call_close(void *f) { ((gn_close_t)f)(); }
static int32_t gn_call_count(void *f, uint32_t *n) { return ((gn_count_t)f)(n); }
static int32_t gn_call_alloc(void *f, int32_t placement, int vnc, size_t size, const char *name, void **t) {
	return ((gn_alloc_t)f)(placement, vnc, size, name, t);
}
static void gn_call_free(void *f, void *t) { void *p = t; ((gn_free_t)f)(&p); }
static size_t gn_call_size(void *f, void *t) { return ((gn_size_t)f)(t); }
static void *gn_call_va(void *f, void *t) { return ((gn_va_t)f)(t); }
static const char *gn_call_str(void *f, int32_t st) { return ((gn_str_t)f)(st); }
static int64_t gn_call_ctl(void *f, const char *key, int64_t v, int set) { return ((gn_ctl_t)f)(key, v, set); }

// gn_xfer moves every op of every batch in one cgo call: through nrt_tensor_{read,write}_batch when the
// runtime has it (batch_fn != NULL), else op by op. On failure *failed_batch/*failed_op name the failing op
// when known (-1 otherwise).
static int32_t gn_xfer(void *one_fn, void *batch_fn, int is_read, const gn_batch *b, uint64_t nb,
		       int64_t *failed_batch, int64_t *failed_op) {
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
*/
import "C"

import (
	"fmt"
	"os"
	"runtime"
	"sync"
	"unsafe"

	"go.uber.org/zap"

	"github.com/gonixl/gonixl/internal/dl"
	"github.com/gonixl/gonixl/internal/lifetime"
)

// EnvLibPath names an environment variable that, when set, is the libnrt.so.1 tried right after
// LoadOptions.Path.
const EnvLibPath = "GONIXL_NRT_LIB"

// LibraryName is libnrt's soname, resolved through the dynamic loader's search path.
const LibraryName = "libnrt.so.1"

// StandardPaths are the library files tried last, in order: where the Neuron SDK installs libnrt.so.1 (not
// on the default loader path). The convention of cuda.StandardPaths and nixl.StandardPaths.
var StandardPaths = []string{"/opt/aws/neuron/lib/" + LibraryName}

// Placement says where nrt_tensor_allocate puts a tensor (nrt_tensor_placement_t).
type Placement int32

const (
	// PlacementDevice is Neuron device memory (HBM) of one NeuronCore.
	PlacementDevice Placement = 0 // device
	// PlacementHost is the deprecated libnrt host placement, limited to less than 4 MiB; prefer your own mmap.
	PlacementHost Placement = 1 // host
	// PlacementVirtual is ordinary host memory managed by libnrt.
	PlacementVirtual Placement = 2 // virtual
)

const frameworkNoFW = 1 // NRT_FRAMEWORK_TYPE_NO_FW

// LoadOptions configure Load. The zero value searches: $GONIXL_NRT_LIB, "libnrt.so.1" through the loader's
// search path, then StandardPaths (the search order of cuda.Load and nixl.Load).
type LoadOptions struct {
	// Path is a libnrt file (or soname) tried first.
	Path string
	// NoSearch restricts Load to Path alone.
	NoSearch bool
	// VisibleCores, if set, is exported as NEURON_RT_VISIBLE_CORES (e.g. "0-1") before nrt_init.
	VisibleCores string
	// MaxTransfer splits device transfers into pieces of at most this many bytes (0: no limit). Keep it a
	// multiple of the device's DMA alignment.
	MaxTransfer uint64
	// Logger receives debug messages; nil logs nothing.
	Logger *zap.Logger
}

// library is one dlopen'ed libnrt with its resolved symbols. Libraries are never unloaded: libnrt owns
// process-wide state and threads.
type library struct {
	path string
	h    unsafe.Pointer

	// required
	init, close, allocate, free, read, write, size unsafe.Pointer
	// NeuronCore counts: the newer vnc names, else the older nc names
	visibleCount, totalCount unsafe.Pointer
	// optional
	va, readBatch, writeBatch, statusStr, version, fakeCtl unsafe.Pointer
}

var (
	libMu   sync.Mutex
	libs    = map[string]*library{}
	openMu  sync.Mutex
	openNow bool // a Runtime of this process holds libnrt (nrt_init done, nrt_close not yet)
)

func (o LoadOptions) candidates() []dl.Candidate {
	return dl.PathSearch(o.Path, o.NoSearch, EnvLibPath, LibraryName, StandardPaths)
}

func loadLibrary(opts LoadOptions) (*library, error) {
	if opts.NoSearch && opts.Path == "" {
		return nil, refuse("load", ErrBadArgument, "LoadOptions.NoSearch needs LoadOptions.Path")
	}
	libMu.Lock()
	defer libMu.Unlock()
	le := &LoadError{Prefix: "neuron", Library: LibraryName, Sentinel: ErrNotLoaded,
		Fix: "install aws-neuronx-runtime-lib, set " + EnvLibPath + " to the library file, or pass LoadOptions.Path " +
			"(without Trainium: neurontest.Build, the fake libnrt)"}
	for _, cand := range opts.candidates() {
		c := cand.Path
		if l, ok := libs[c]; ok {
			return l, nil
		}
		cpath := C.CString(c)
		var cerr *C.char
		h := C.gn_dlopen(cpath, &cerr)
		C.free(unsafe.Pointer(cpath))
		if h == nil {
			msg := "unknown dlopen error"
			if cerr != nil {
				msg = C.GoString(cerr)
				C.free(unsafe.Pointer(cerr))
			}
			le.Add(c, msg)
			continue
		}
		l, err := resolve(c, h)
		if err != nil {
			return nil, err
		}
		libs[c] = l
		return l, nil
	}
	return nil, le
}

// LoadError reports that no libnrt could be loaded: each candidate (Tried) with why it failed (Why). It
// unwraps to ErrNotLoaded; it is the loaders' one shape (nixl.LoadError and cuda.LoadError are the same type).
type LoadError = dl.LoadError

func sym(h unsafe.Pointer, names ...string) unsafe.Pointer {
	for _, n := range names {
		cn := C.CString(n)
		p := C.gn_dlsym(h, cn)
		C.free(unsafe.Pointer(cn))
		if p != nil {
			return p
		}
	}
	return nil
}

func resolve(path string, h unsafe.Pointer) (*library, error) {
	l := &library{path: path, h: h}
	required := []struct {
		dst   *unsafe.Pointer
		names []string
	}{
		{&l.init, []string{"nrt_init"}},
		{&l.close, []string{"nrt_close"}},
		{&l.allocate, []string{"nrt_tensor_allocate"}},
		{&l.free, []string{"nrt_tensor_free"}},
		{&l.read, []string{"nrt_tensor_read"}},
		{&l.write, []string{"nrt_tensor_write"}},
		{&l.size, []string{"nrt_tensor_get_size"}},
		{&l.visibleCount, []string{"nrt_get_visible_vnc_count", "nrt_get_visible_nc_count"}},
		{&l.totalCount, []string{"nrt_get_total_vnc_count", "nrt_get_total_nc_count"}},
	}
	for _, r := range required {
		if *r.dst = sym(h, r.names...); *r.dst == nil {
			return nil, refuse("load", ErrSymbol, "%s has no %s; it is not a usable libnrt (Neuron Runtime 2.x needed)",
				path, r.names[0])
		}
	}
	l.va = sym(h, "nrt_tensor_get_va")
	l.readBatch = sym(h, "nrt_tensor_read_batch")
	l.writeBatch = sym(h, "nrt_tensor_write_batch")
	l.statusStr = sym(h, "nrt_get_status_as_str")
	l.version = sym(h, "nrt_get_version")
	l.fakeCtl = sym(h, "fake_nrt_ctl")
	return l, nil
}

func (l *library) describe(st Status) string {
	if l.statusStr == nil {
		return ""
	}
	s := C.gn_call_str(l.statusStr, C.int32_t(st))
	if s == nil {
		return ""
	}
	return C.GoString(s)
}

func (l *library) err(op string, st C.int32_t) error {
	if st == 0 {
		return nil
	}
	return statusError(op, Status(st), l.describe(Status(st)))
}

// Available reports whether a libnrt can be loaded with these options (it does not initialise it).
func Available(opts LoadOptions) bool {
	_, err := loadLibrary(opts)
	return err == nil
}

// Runtime is this process's handle on libnrt: nrt_init on Load, nrt_close on Close.
//
// The Neuron runtime gives one process exclusive use of its NeuronCores: a NeuronCore claimed by nrt_init
// in one process cannot be used by another, so a sidecar process can never read the KV tensors of a
// vLLM/NxDI process. The Go program must either be the process that allocates and owns the device tensors
// (then stage them with NewDeviceSource) or be handed host copies of them (NewHostSource). libnrt is
// process-wide, so at most one Runtime is open at a time.
//
// Concurrency: all methods are safe for concurrent use; transfers run in parallel, Close waits for them.
type Runtime struct {
	lib         *library
	log         *zap.Logger
	maxTransfer uint64

	version Version // zero when the runtime cannot tell

	mu      sync.RWMutex // transfers hold it shared; allocate, free and close exclusively
	closed  bool
	tensors map[*Tensor]struct{}
	cleanup runtime.Cleanup
}

// Load loads libnrt, resolves its functions and initialises the runtime (nrt_init with no framework). When
// no library loads the error is a *LoadError (errors.Is(err, ErrNotLoaded)) listing every candidate.
func Load(opts LoadOptions) (*Runtime, error) {
	lib, err := loadLibrary(opts)
	if err != nil {
		return nil, err
	}
	openMu.Lock()
	defer openMu.Unlock()
	if openNow {
		return nil, refuse("load", ErrBusy, "close the existing Runtime first (libnrt state is process-wide)")
	}
	if opts.VisibleCores != "" {
		if err := os.Setenv("NEURON_RT_VISIBLE_CORES", opts.VisibleCores); err != nil {
			return nil, refuse("load", ErrBadArgument, "set NEURON_RT_VISIBLE_CORES to LoadOptions.VisibleCores %q: %w", opts.VisibleCores, err)
		}
	}
	if st := C.gn_call_init(lib.init, frameworkNoFW); st != 0 {
		return nil, lib.err("nrt_init", st)
	}
	openNow = true
	log := opts.Logger
	if log == nil {
		log = zap.NewNop()
	}
	r := &Runtime{lib: lib, log: log, maxTransfer: opts.MaxTransfer, tensors: map[*Tensor]struct{}{}}
	if lib.version != nil {
		var v C.gn_version
		if C.gn_call_version(lib.version, &v) == 0 {
			r.version = Version{Major: uint64(v.major), Minor: uint64(v.minor), Patch: uint64(v.patch), Maintenance: uint64(v.maintenance),
				Detail: C.GoString(&v.rt_detail[0])}
		}
	}
	// Safety net: a Runtime dropped without Close still releases libnrt.
	r.cleanup = runtime.AddCleanup(r, func(l *library) {
		openMu.Lock()
		defer openMu.Unlock()
		C.gn_call_close(l.close)
		openNow = false
	}, lib)
	log.Debug("libnrt initialised", zap.String("path", lib.path), zap.Bool("batch", lib.readBatch != nil))
	return r, nil
}

// Version is a libnrt runtime version (nrt_get_version).
type Version struct {
	Major, Minor, Patch, Maintenance uint64
	Detail                           string
}

func (v Version) String() string { return fmt.Sprintf("%d.%d.%d", v.Major, v.Minor, v.Patch) }

// Less reports whether v is older than major.minor.patch.
func (v Version) Less(major, minor, patch uint64) bool {
	if v.Major != major {
		return v.Major < major
	}
	if v.Minor != minor {
		return v.Minor < minor
	}
	return v.Patch < patch
}

// LargeTensorVersion is the first libnrt (Neuron 2.28, runtime 2.30.50) whose nrt_tensor_allocate handles
// tensors of 4 GiB and more; older runtimes overflow.
var LargeTensorVersion = Version{Major: 2, Minor: 30, Patch: 50}

// Version returns the runtime's version (zero when it does not offer nrt_get_version).
func (r *Runtime) Version() Version { return r.version }

// Path is the library file (or loader name) that was opened.
func (r *Runtime) Path() string { return r.lib.path }

// HasBatch reports whether the runtime offers nrt_tensor_read_batch (else batches run op by op).
func (r *Runtime) HasBatch() bool { return r.lib.readBatch != nil }

// Close frees every tensor still allocated through this Runtime (children first) and closes libnrt. It is
// idempotent.
func (r *Runtime) Close() error { return lifetime.CloseOnce(&r.mu, &r.closed, r.teardown) }

// teardown is Close's work, run once with r.mu locked.
func (r *Runtime) teardown() error {
	for t := range r.tensors {
		t.freeLocked()
	}
	r.tensors = nil
	r.cleanup.Stop()
	openMu.Lock()
	C.gn_call_close(r.lib.close)
	openNow = false
	openMu.Unlock()
	runtime.KeepAlive(r)
	return nil
}

func (r *Runtime) count(fn unsafe.Pointer, op string) (int, error) {
	var n C.uint32_t
	if st := C.gn_call_count(fn, &n); st != 0 {
		return 0, r.lib.err(op, st)
	}
	return int(n), nil
}

// VisibleCores returns the number of NeuronCores this process can use.
func (r *Runtime) VisibleCores() (int, error) {
	return r.count(r.lib.visibleCount, "nrt_get_visible_vnc_count")
}

// TotalCores returns the number of NeuronCores on the instance.
func (r *Runtime) TotalCores() (int, error) {
	return r.count(r.lib.totalCount, "nrt_get_total_vnc_count")
}

// Allocate allocates a tensor of size bytes. vnc is the NeuronCore (relative to the visible ones) for device
// placement and is ignored (passed as -1) otherwise.
func (r *Runtime) Allocate(p Placement, vnc int, size uint64, name string) (*Tensor, error) {
	if p < PlacementDevice || p > PlacementVirtual {
		return nil, refuse("allocate", ErrBadArgument, "unknown placement %d", p)
	}
	if size == 0 {
		return nil, refuse("allocate", ErrBadArgument, "tensor %q has size 0", name)
	}
	if p == PlacementDevice && vnc < 0 {
		return nil, refuse("allocate", ErrBadArgument, "device tensor %q needs a NeuronCore index >= 0, got %d", name, vnc)
	}
	if p != PlacementDevice {
		vnc = -1
	}
	if lt := LargeTensorVersion; size >= 4<<30 && r.version.Less(lt.Major, lt.Minor, lt.Patch) {
		return nil, refuse("allocate", ErrTooLarge, "tensor %q of %d bytes: libnrt %v overflows at 4 GiB and more (fixed in %v, Neuron 2.28); upgrade the runtime or use smaller tensors",
			name, size, r.version, lt)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil, refuse("allocate", ErrClosed, "the Runtime was closed; Load a new one")
	}
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	var h unsafe.Pointer
	if st := C.gn_call_alloc(r.lib.allocate, C.int32_t(p), C.int(vnc), C.size_t(size), cname, &h); st != 0 {
		return nil, fmt.Errorf("allocate %s tensor %q of %d bytes on core %d: %w", p, name, size, vnc, r.lib.err("nrt_tensor_allocate", st))
	}
	t := &Tensor{rt: r, h: h, size: size, name: name, placement: p, vnc: vnc}
	r.tensors[t] = struct{}{}
	return t, nil
}

// Tensor is a libnrt tensor allocated through a Runtime. Device tensors are opaque: their bytes are reached
// only through Read/Write (DMA), never by dereferencing an address.
//
// Concurrency: transfers may run concurrently (on one or several tensors); Free waits for them.
type Tensor struct {
	rt        *Runtime
	h         unsafe.Pointer // nrt_tensor_t*, guarded by rt.mu
	size      uint64
	name      string
	placement Placement
	vnc       int
}

// Size is the tensor's size in bytes.
func (t *Tensor) Size() uint64 { return t.size }

// Name is the name given at allocation.
func (t *Tensor) Name() string { return t.name }

// Placement is where the tensor lives.
func (t *Tensor) Placement() Placement { return t.placement }

// Core is the NeuronCore of a device tensor (-1 for host placements).
func (t *Tensor) Core() int { return t.vnc }

// NativeSize asks libnrt for the tensor's size (nrt_tensor_get_size); 0 after Free.
func (t *Tensor) NativeSize() uint64 {
	t.rt.mu.RLock()
	defer t.rt.mu.RUnlock()
	if t.h == nil {
		return 0
	}
	return uint64(C.gn_call_size(t.rt.lib.size, t.h))
}

// DeviceAddress returns the tensor's virtual address (nrt_tensor_get_va), e.g. for registering Neuron HBM with
// a NIXL backend that supports it. It is opaque: never dereference it. 0 when unsupported or freed.
func (t *Tensor) DeviceAddress() uintptr {
	t.rt.mu.RLock()
	defer t.rt.mu.RUnlock()
	if t.h == nil || t.rt.lib.va == nil {
		return 0
	}
	return uintptr(C.gn_call_va(t.rt.lib.va, t.h))
}

// Free releases the tensor. It is idempotent.
func (t *Tensor) Free() error {
	t.rt.mu.Lock()
	defer t.rt.mu.Unlock()
	t.freeLocked()
	return nil
}

func (t *Tensor) freeLocked() {
	if t.h == nil {
		return
	}
	C.gn_call_free(t.rt.lib.free, t.h)
	t.h = nil
	delete(t.rt.tensors, t)
}

// Op is one contiguous transfer between a tensor at Offset and the host bytes Buf (the destination of a read,
// the source of a write).
type Op struct {
	Offset uint64
	Buf    []byte
}

// Batch is a list of transfers on one tensor.
type Batch struct {
	Tensor *Tensor
	Ops    []Op
}

// Read copies len(dst) bytes from the tensor at off into dst.
func (t *Tensor) Read(dst []byte, off uint64) error {
	return t.rt.transfer(true, []Batch{{Tensor: t, Ops: []Op{{Offset: off, Buf: dst}}}})
}

// Write copies src into the tensor at off.
func (t *Tensor) Write(src []byte, off uint64) error {
	return t.rt.transfer(false, []Batch{{Tensor: t, Ops: []Op{{Offset: off, Buf: src}}}})
}

// ReadOps performs every read in one native call.
func (t *Tensor) ReadOps(ops []Op) error { return t.rt.transfer(true, []Batch{{Tensor: t, Ops: ops}}) }

// ReadBatch performs every read of every batch in one native call: nrt_tensor_read_batch when the runtime
// has it, else a loop of nrt_tensor_read on the C side. It returns when all reads completed or one failed.
func (r *Runtime) ReadBatch(batches []Batch) error { return r.transfer(true, batches) }

// WriteBatch is ReadBatch's mirror for host → device copies.
func (r *Runtime) WriteBatch(batches []Batch) error { return r.transfer(false, batches) }

func (r *Runtime) transfer(read bool, batches []Batch) error {
	verb := "read"
	if !read {
		verb = "write"
	}
	refused := "tensor " + verb // the op of a refusal
	// Validate on the Go side before any native call, and count the (split) ops.
	total := 0
	for i, b := range batches {
		if b.Tensor == nil {
			return refuse(refused, ErrBadArgument, "batch %d has no tensor", i)
		}
		if b.Tensor.rt != r {
			return refuse(refused, ErrBadArgument, "batch %d: tensor %q belongs to another Runtime", i, b.Tensor.name)
		}
		for j, op := range b.Ops {
			n := uint64(len(op.Buf))
			if op.Offset > b.Tensor.size || n > b.Tensor.size-op.Offset {
				return refuse(refused, ErrBadArgument, "%s of %d bytes at offset %d is outside tensor %q (%d bytes) (batch %d, op %d)",
					verb, n, op.Offset, b.Tensor.name, b.Tensor.size, i, j)
			}
			total += r.pieces(n)
		}
	}
	if total == 0 {
		return nil
	}
	r.mu.RLock()
	defer r.mu.RUnlock()
	if r.closed {
		return refuse(refused, ErrClosed, "the Runtime was closed; Load a new one")
	}
	for _, b := range batches {
		if b.Tensor.h == nil {
			return refuse(refused, ErrInvalidHandle, "tensor %q was freed", b.Tensor.name)
		}
	}

	cops := (*C.gn_op)(C.calloc(C.size_t(total), C.size_t(unsafe.Sizeof(C.gn_op{}))))
	cbat := (*C.gn_batch)(C.calloc(C.size_t(len(batches)), C.size_t(unsafe.Sizeof(C.gn_batch{}))))
	if cops == nil || cbat == nil {
		C.free(unsafe.Pointer(cops))
		C.free(unsafe.Pointer(cbat))
		return refuse(refused, ErrResource, "out of C memory for %d transfer descriptors", total)
	}
	defer C.free(unsafe.Pointer(cops))
	defer C.free(unsafe.Pointer(cbat))
	ops := unsafe.Slice(cops, total)
	bats := unsafe.Slice(cbat, len(batches))

	// Buffers may be Go memory: pin them while C holds their addresses (no-op for mmap'd memory).
	var pin runtime.Pinner
	defer pin.Unpin()
	k := 0
	for i, b := range batches {
		first := k
		for _, op := range b.Ops {
			if len(op.Buf) == 0 {
				continue
			}
			base := unsafe.Pointer(unsafe.SliceData(op.Buf))
			pin.Pin(base)
			for done := uint64(0); done < uint64(len(op.Buf)); {
				n := uint64(len(op.Buf)) - done
				if r.maxTransfer > 0 && n > r.maxTransfer {
					n = r.maxTransfer
				}
				ops[k] = C.gn_op{offset: C.uint64_t(op.Offset + done), size: C.uint64_t(n), buffer: unsafe.Add(base, done)}
				k++
				done += n
			}
		}
		bats[i] = C.gn_batch{tensor: b.Tensor.h, ops: &ops[first], num_ops: C.uint32_t(k - first)}
		if k == first {
			bats[i].ops = nil
		}
	}

	one, batchFn, op := r.lib.read, r.lib.readBatch, "nrt_tensor_read"
	if !read {
		one, batchFn, op = r.lib.write, r.lib.writeBatch, "nrt_tensor_write"
	}
	if batchFn != nil {
		op += "_batch"
	}
	var fb, fo C.int64_t
	st := C.gn_xfer(one, batchFn, boolInt(read), cbat, C.uint64_t(len(batches)), &fb, &fo)
	if st != 0 {
		err := r.lib.err(op, st)
		if fb >= 0 {
			b := batches[fb]
			return fmt.Errorf("%s tensor %q (piece %d of the batch): %w", verb, b.Tensor.name, int64(fo), err)
		}
		return fmt.Errorf("%s of %d pieces over %d tensors: %w", verb, total, len(batches), err)
	}
	return nil
}

func (r *Runtime) pieces(n uint64) int {
	if n == 0 {
		return 0
	}
	if r.maxTransfer == 0 {
		return 1
	}
	return int((n + r.maxTransfer - 1) / r.maxTransfer)
}

func boolInt(b bool) C.int {
	if b {
		return 1
	}
	return 0
}

// fakeCtl reads (and with set, first writes) a knob or counter of the fake libnrt (neurontest). ok is false
// when the loaded library is not the fake.
func (r *Runtime) fakeCtl(key string, value int64, set bool) (v int64, ok bool) {
	if r.lib.fakeCtl == nil {
		return 0, false
	}
	ck := C.CString(key)
	defer C.free(unsafe.Pointer(ck))
	s := C.int(0)
	if set {
		s = 1
	}
	return int64(C.gn_call_ctl(r.lib.fakeCtl, ck, C.int64_t(value), s)), true
}
