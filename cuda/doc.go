// Package cuda is gonixl's CUDA device package: a binding of the CUDA driver API loaded at run time, and
// paged KV caches in GPU memory (VRAM) that register with NIXL and copy blocks to and from host memory.
//
// # Loading
//
// libcuda.so.1 is opened with dlopen and the entry points are bound with dlsym, so the package builds
// with no CUDA toolkit or driver installed; the prototypes are declared in gcu.h. Load tries
// LoadOptions.Path, $GONIXL_CUDA_LIB, the loader's search path ("libcuda.so.1"), then StandardPaths, and
// binds the versioned entry points (cuMemAlloc_v2, cuMemcpyHtoDAsync_v2, cuDevicePrimaryCtxRelease_v2, ...)
// where the driver exports them. If nothing loads, the *LoadError lists each candidate and why it failed
// (errors.Is(err, ErrNotLoaded)); if the driver loads but cuInit fails, the *Error carries the driver's
// status (e.g. ErrNoDevice).
//
// # Contexts and OS threads
//
// CUDA keeps the current context per OS thread, and goroutines migrate between threads. This package
// binds the device's primary context with cuCtxSetCurrent at the start of every C call that uses it,
// inside that same cgo call, so its methods work from any goroutine without locking OS threads. Calls
// into other native code that expects a current context (NIXL/UCX registering VRAM, posting transfers
// into VRAM) go through Device.Do, which locks the OS thread and binds the context while a function runs,
// or KVCache.Do, the same for a cache's device, which makes a KVCache the connector's DeviceContext. The
// function must not close the device nor take it again (Device.Do lists what would deadlock).
//
// # Memory and copies
//
// Device.Alloc (cuMemAlloc_v2), Device.AllocHost (pinned, cuMemHostAlloc), Device.RegisterHost (pinning
// memory allocated elsewhere, e.g. nixl.AllocHost), synchronous copies (DeviceMem.Write/Read/CopyFrom,
// Device.Copy), and batches of asynchronous copies on streams (Stream.Enqueue, Device.CopyBatch) that issue
// a whole list of copies in one cgo call. Events order streams and time work. Device.PointerInfo reports
// what the driver knows about an address.
//
// # KV caches
//
// NewKVCache allocates a paged KV cache in VRAM for a layout.Geometry, every region in one allocation.
// It exposes what vLLM's NixlConnector handshake needs (RegionBases, BlockLens, MemType VRAM, DeviceID =
// CUDA ordinal), registers with a nixl.Agent (Register) and builds its transfer descriptors (Descs).
// NewHostKVCache is the pinned host twin (MemType DRAM) for the host-buffered decode mode, and
// KVCache.CopyFromHost / CopyToHost move many blocks across every region in one batch.
//
// # Errors
//
// Driver failures are *Error values: the entry point, what was asked (Detail), the status (Code) with the
// driver's own name and description of it (cuGetErrorName, cuGetErrorString), and a hint. Result is the status
// type and the sentinels (ErrOutOfMemory, ErrInvalidValue, ...) are Results, so errors.Is works on any error of
// the package, and a status without a sentinel matches itself (errors.Is(err, Result(719))). Arguments refused
// before the driver is called, and closed handles (ErrClosed), are *Error too, with Native false; one that
// wraps another package's error (layout's refusal of a geometry, the context that ended a wait) keeps it as its
// Cause, which errors.Is matches. Every error of the package is an *Error or joins some, except Load's
// *LoadError, Register's *nixl.Error and the layout error of Descs. *Error is the one error shape of nixl, cuda
// and neuron (each over its own codes).
//
// # Handles and concurrency
//
// Device, DeviceMem, HostMem, HostRegistration, Stream, Event, KVCache and HostKVCache are safe for
// concurrent use, and each has an idempotent Close. A handle is never freed under a running call on it.
// Closing a Device closes everything still open on it first, then releases its primary context. Handles
// dropped without Close are freed by a runtime cleanup, as a safety net only.
package cuda

//go:generate go tool stringer -linecomment -output=string.go -type=Direction,MemoryType
