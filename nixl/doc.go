// Package nixl is a Go API over NIXL, NVIDIA's Inference Xfer Library, through NIXL's C API
// (libnixl_capi.so, the nixl_capi_* functions). It is the only gonixl package that talks to NIXL.
//
// # Loading
//
// NIXL is loaded at run time with dlopen, so programs build (and vet) with no NIXL installed; the C
// prototypes are declared by this package (gx.h). Load looks for libnixl_capi.so in LoadOptions.LibDir,
// $NIXL_LIB_DIR, the dynamic loader's search path, then StandardPaths, and sets NIXL_PLUGIN_DIR to the
// "plugins" folder beside the library unless it is set. `make nixl` unpacks the pinned PyPI wheel
// (nixl-cu12 / nixl-cu13) into .nixl/current/lib. When nothing loads, the *LoadError lists every place
// tried and says how to fix it; errors.Is(err, ErrNotLoaded) is true.
//
// # Handles and ownership
//
// An Agent owns its Backends, Registrations (registered memory), Prepped descriptor lists and Xfer
// transfer requests. Every handle has an idempotent Close. Closing an Agent first releases its open
// children (requests, then prepared lists, then registrations) and then the agent; their own Close is a
// no-op afterwards and their other methods return ErrClosed. A handle dropped without Close is reported
// through OnLeak (and released) by a runtime cleanup; this is a safety net, not a way to manage handles.
//
// Registered memory must stay mapped at a fixed address until it is deregistered, so it is never Go heap
// memory: use AllocHost (page-aligned mmap, optionally mlocked and on huge pages: reserved ones, else
// transparent ones) for DRAM, or device memory from a device package.
//
// # Batch-first
//
// Descriptor and index arrays go to NIXL whole, one cgo call per array: Prep, RegisterMem, CreateXfer and
// MakeXfer never make one cgo call per descriptor. Indices are validated against the prepared lists before
// NIXL sees them (ErrIndexOutOfRange).
//
// # Backend options
//
// UCXOptions are the UCX backend's init parameters as typed fields (devices, workers, NIXL's thread pool and
// its batch size, the error-handling mode, engine_config for UCX settings); DefaultUCXOptions are gonixl's
// measured defaults. UCX_* environment variables override engine_config keys. WithoutDescMerge turns off
// NIXL's merge of adjacent descriptors for one request (a thread pool splits a request by descriptors).
//
// # Errors
//
// Errors from NIXL are *Error values: the operation, what was asked (Detail), the C API's status (Code,
// with its C name) and a hint; errors.Is matches the sentinels ErrInvalidParam, ErrBackend,
// ErrInvalidState, ErrException, ErrNoTelemetry and ErrNotFound. NIXL's C API folds several NIXL codes into
// ErrBackend. Calls refused before NIXL is reached (ErrClosed, ErrIndexOutOfRange, bad arguments) are *Error
// too, with Native false, and so is a wait ended by its context (no sentinel; errors.Is matches the
// context's error, its Cause). Every error of the package is an *Error, or Load's *LoadError. *Error is the
// one error shape of nixl, cuda and neuron (each over its own codes). "In progress" is a State, never an
// error.
//
// # Concurrency
//
// Library, Agent, Backend, Registration, Prepped and Xfer are safe for concurrent use. By default agents run
// NIXL's RW locking mode and a progress thread, so transfers complete without the application polling the
// target side. Xfer.Wait polls with backoff and honours its context.
package nixl

//go:generate go tool stringer -linecomment -output=string.go -type=Op,State,MemType,childKind
