package neuron

import (
	"fmt"
	"os"
	"runtime"
	"sync"

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
	h    libHandle

	// required
	init, close, allocate, free, read, write, size symbol
	// NeuronCore counts: the newer vnc names, else the older nc names
	visibleCount, totalCount symbol
	// optional
	va, readBatch, writeBatch, statusStr, version, fakeCtl symbol
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
		h, msg := cDlopen(c)
		if h == nil {
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

func resolve(path string, h libHandle) (*library, error) {
	l := &library{path: path, h: h}
	required := []struct {
		dst   *symbol
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
		if *r.dst = cDlsym(h, r.names...); *r.dst == nil {
			return nil, refuse("load", ErrSymbol, "%s has no %s; it is not a usable libnrt (Neuron Runtime 2.x needed)",
				path, r.names[0])
		}
	}
	l.va = cDlsym(h, "nrt_tensor_get_va")
	l.readBatch = cDlsym(h, "nrt_tensor_read_batch")
	l.writeBatch = cDlsym(h, "nrt_tensor_write_batch")
	l.statusStr = cDlsym(h, "nrt_get_status_as_str")
	l.version = cDlsym(h, "nrt_get_version")
	l.fakeCtl = cDlsym(h, "fake_nrt_ctl")
	return l, nil
}

func (l *library) describe(st Status) string {
	if l.statusStr == nil {
		return ""
	}
	return cStatusString(l.statusStr, st)
}

func (l *library) err(op string, st Status) error {
	if st == 0 {
		return nil
	}
	return statusError(op, st, l.describe(st))
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
	if st := cInit(lib.init, frameworkNoFW); st != 0 {
		return nil, lib.err("nrt_init", st)
	}
	openNow = true
	log := opts.Logger
	if log == nil {
		log = zap.NewNop()
	}
	r := &Runtime{lib: lib, log: log, maxTransfer: opts.MaxTransfer, tensors: map[*Tensor]struct{}{}}
	if lib.version != nil {
		if v, ok := cVersion(lib.version); ok {
			r.version = v
		}
	}
	// Safety net: a Runtime dropped without Close still releases libnrt.
	r.cleanup = runtime.AddCleanup(r, func(l *library) {
		openMu.Lock()
		defer openMu.Unlock()
		cClose(l.close)
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
	cClose(r.lib.close)
	openNow = false
	openMu.Unlock()
	runtime.KeepAlive(r)
	return nil
}

func (r *Runtime) count(fn symbol, op string) (int, error) {
	n, st := cCount(fn)
	if st != 0 {
		return 0, r.lib.err(op, st)
	}
	return n, nil
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
	h, st := cAlloc(r.lib.allocate, p, vnc, size, name)
	if st != 0 {
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
	h         tensorHandle // guarded by rt.mu
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
	return cSize(t.rt.lib.size, t.h)
}

// DeviceAddress returns the tensor's virtual address (nrt_tensor_get_va), e.g. for registering Neuron HBM with
// a NIXL backend that supports it. It is opaque: never dereference it. 0 when unsupported or freed.
func (t *Tensor) DeviceAddress() uintptr {
	t.rt.mu.RLock()
	defer t.rt.mu.RUnlock()
	if t.h == nil || t.rt.lib.va == nil {
		return 0
	}
	return cVA(t.rt.lib.va, t.h)
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
	cFree(t.rt.lib.free, t.h)
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

	one, batchFn, op := r.lib.read, r.lib.readBatch, "nrt_tensor_read"
	if !read {
		one, batchFn, op = r.lib.write, r.lib.writeBatch, "nrt_tensor_write"
	}
	if batchFn != nil {
		op += "_batch"
	}
	st, fb, fo, oom := cTransfer(one, batchFn, read, batches, total, r.maxTransfer)
	if oom {
		return refuse(refused, ErrResource, "out of C memory for %d transfer descriptors", total)
	}
	if st != 0 {
		err := r.lib.err(op, st)
		if fb >= 0 {
			b := batches[fb]
			return fmt.Errorf("%s tensor %q (piece %d of the batch): %w", verb, b.Tensor.name, fo, err)
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

// fakeCtl reads (and with set, first writes) a knob or counter of the fake libnrt (neurontest). ok is false
// when the loaded library is not the fake.
func (r *Runtime) fakeCtl(key string, value int64, set bool) (v int64, ok bool) {
	if r.lib.fakeCtl == nil {
		return 0, false
	}
	return cCtl(r.lib.fakeCtl, key, value, set), true
}
