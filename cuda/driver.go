package cuda

import (
	"fmt"
	"os"
	"sync"

	"github.com/gonixl/gonixl/internal/dl"
)

// EnvLibPath names an environment variable that, when set, is the libcuda.so.1 tried right after
// LoadOptions.Path.
const EnvLibPath = "GONIXL_CUDA_LIB"

// LibraryName is the soname of the CUDA driver library, resolved through the dynamic loader's search path.
const LibraryName = "libcuda.so.1"

// StandardPaths are the library files tried last, in order, after the loader's search path: where
// distributions, the NVIDIA container toolkit and WSL put the driver's libcuda.so.1 (the convention of
// nixl.StandardPaths and neuron.StandardPaths). The CUDA toolkit's stubs/libcuda.so is deliberately absent.
var StandardPaths = []string{
	"/usr/lib/x86_64-linux-gnu/libcuda.so.1",
	"/usr/lib/aarch64-linux-gnu/libcuda.so.1",
	"/usr/lib64/libcuda.so.1",
	"/usr/local/nvidia/lib64/libcuda.so.1",
	"/usr/local/nvidia/lib/libcuda.so.1",
	"/usr/lib/wsl/lib/libcuda.so.1",
}

// LoadOptions tell Load where the driver library is. The zero value searches: $GONIXL_CUDA_LIB, the
// loader's search path (LD_LIBRARY_PATH, ld.so.cache) by soname, then StandardPaths.
type LoadOptions struct {
	// Path is a libcuda.so.1 (a file path or a soname) tried first.
	Path string
	// NoSearch restricts Load to Path alone.
	NoSearch bool
}

// Driver is the CUDA driver API, loaded and initialised (cuInit) in this process. There is one per process;
// it is never unloaded. A Driver is safe for concurrent use.
type Driver struct {
	path    string
	version int
}

var (
	loadMu sync.Mutex
	loaded *Driver
)

// candidates lists what Load tries, in order, without duplicates (internal/dl's one search order).
func (o LoadOptions) candidates() []dl.Candidate {
	return dl.PathSearch(o.Path, o.NoSearch, EnvLibPath, LibraryName, StandardPaths)
}

// Load opens libcuda.so.1, binds the driver entry points this package uses (the _v2 versions where the
// driver exports them) and calls cuInit. When no library can be loaded the error is a *LoadError
// (errors.Is(err, ErrNotLoaded)) listing every candidate and why it failed; when the library loads but
// cuInit fails (no GPU, stub library, driver mismatch) the error is an *Error with the driver's status,
// e.g. errors.Is(err, ErrNoDevice).
//
// Load is process-wide: the first library bound stays, and later calls that succeed return the same
// *Driver. Failed loads are not remembered, so a later call may succeed.
func Load(opts LoadOptions) (*Driver, error) {
	if opts.NoSearch && opts.Path == "" {
		return nil, invalid("load", "LoadOptions.NoSearch needs LoadOptions.Path")
	}
	loadMu.Lock()
	defer loadMu.Unlock()
	le := &LoadError{Prefix: "cuda", Library: LibraryName, Sentinel: ErrNotLoaded,
		Fix: "install the NVIDIA driver, or set LoadOptions.Path / " + EnvLibPath + " to its libcuda.so.1"}
	var path string
	for _, cand := range opts.candidates() {
		c := cand.Path
		if c != LibraryName && c[0] == '/' {
			if _, err := os.Stat(c); err != nil {
				le.Add(c, "not present")
				continue
			}
		}
		why, ok := cLoad(c)
		if ok {
			path = c
			break
		}
		le.Add(c, why)
	}
	if path == "" {
		return nil, le
	}
	if loaded != nil {
		return loaded, nil
	}
	if err := check(cInit(), "cuInit", "library "+path); err != nil {
		return nil, err
	}
	v, r := cDriverVersion()
	if err := check(r, "cuDriverGetVersion", ""); err != nil {
		return nil, err
	}
	loaded = &Driver{path: path, version: v}
	return loaded, nil
}

// Path is the candidate that was loaded (a path, or the soname resolved by the dynamic loader).
func (d *Driver) Path() string { return d.path }

// Version is the driver's CUDA version as cuDriverGetVersion reports it, e.g. 13000 for CUDA 13.0.
func (d *Driver) Version() int { return d.version }

// VersionString formats Version as "13.0".
func (d *Driver) VersionString() string {
	return fmt.Sprintf("%d.%d", d.version/1000, (d.version%1000)/10)
}

// Symbols lists the driver entry points bound, in binding order (e.g. "cuMemAlloc_v2").
func (d *Driver) Symbols() []string { return cSymbols() }

// DeviceCount is the number of CUDA devices visible to this process.
func (d *Driver) DeviceCount() (int, error) {
	n, r := cDeviceCount()
	return n, check(r, "cuDeviceGetCount", "")
}

// BatchCopyABI reports how batches of copies (Stream.Enqueue, Device.CopyBatch, KVCache copies) are issued:
// 13 or 12 when by one cuMemcpyBatchAsync call (that CUDA ABI, resolved with cuGetProcAddress), 0 when by one
// driver call per copy (a driver older than CUDA 12.8, or GONIXL_CUDA_NO_BATCH set).
func (d *Driver) BatchCopyABI() int { return cBatchABI() }
