package nixl

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"go.uber.org/zap"

	"github.com/gonixl/gonixl/internal/dl"
)

// LibraryName is the file name of NIXL's C API library.
const LibraryName = "libnixl_capi.so"

// EnvLibDir names the environment variable of the folder holding libnixl_capi.so, tried right after
// LoadOptions.LibDir. It is NIXL's own name, not a GONIXL_ one like cuda.EnvLibPath and neuron.EnvLibPath,
// because NIXL's images already set it (Dynamo's and NVIDIA's containers: NIXL_LIB_DIR, NIXL_PLUGIN_DIR,
// NIXL_PREFIX), so a Go worker in them finds the NIXL the Python side uses without configuration.
const EnvLibDir = "NIXL_LIB_DIR"

// StandardPaths are the library files tried last, in order: where NIXL's own installers put
// libnixl_capi.so (the convention of cuda.StandardPaths and neuron.StandardPaths). NIXL's plugins are
// looked for in the "plugins" folder beside the file found.
var StandardPaths = []string{
	"/opt/nvidia/nvda_nixl/lib/x86_64-linux-gnu/" + LibraryName,
	"/opt/nvidia/nvda_nixl/lib64/" + LibraryName,
	"/opt/nvidia/nvda_nixl/lib/" + LibraryName,
}

// LoadOptions tell Load where NIXL is. The zero value searches, in order: $NIXL_LIB_DIR, the dynamic
// loader's search path (LD_LIBRARY_PATH, ld.so.cache), then StandardPaths.
type LoadOptions struct {
	// LibDir is the folder holding libnixl_capi.so; when set it is tried first.
	LibDir string
	// PluginDir overrides the plugin folder. When empty and NIXL_PLUGIN_DIR is unset, it is set to the
	// "plugins" folder beside the library found (where NIXL itself would look).
	PluginDir string
	// DepDirs are folders of libraries that NIXL's plugins need and the dynamic loader would not find
	// (LIBFABRIC's libfabric.so.1 and libhwloc.so.15, `make fabric-deps`): Load dlopens each library in
	// them with RTLD_GLOBAL before NIXL, so a plugin's DT_NEEDED of that soname resolves to it, with no
	// LD_LIBRARY_PATH. The folders of $GONIXL_NIXL_DEPS (EnvDepDirs) follow. A Load that finds NIXL already
	// loaded preloads nothing.
	DepDirs []string
	// Logger receives load diagnostics; nil means no logging.
	Logger *zap.Logger
}

// Library is NIXL's C API, loaded into the process. NIXL is process-wide (its plugin manager is a
// singleton), so there is at most one Library per process; it is never unloaded. A Library is safe for
// concurrent use.
type Library struct {
	path      string
	pluginDir string
	custom    bool
	skipMerge bool
	deps      []Dep
	depDirs   []string
	log       *zap.Logger
}

// Path returns the absolute path of the loaded libnixl_capi.so.
func (l *Library) Path() string { return l.path }

// Dir returns the folder of the loaded library.
func (l *Library) Dir() string { return filepath.Dir(l.path) }

// PluginDir returns the plugin folder NIXL uses (NIXL_PLUGIN_DIR at load time).
func (l *Library) PluginDir() string { return l.pluginDir }

// HasCustomParams reports whether this NIXL's C API has the optional custom-parameter call.
func (l *Library) HasCustomParams() bool { return l.custom }

// HasSkipDescMerge reports whether this NIXL's C API has the skip-descriptor-merge option (WithoutDescMerge).
func (l *Library) HasSkipDescMerge() bool { return l.skipMerge }

// Version returns NIXL's version when it can be read from the library's folder layout (the wheel's
// dist-info or the folder name given by the Makefile), else "".
func (l *Library) Version() string {
	// .nixl/cuXX-<version>/lib/libnixl_capi.so as unpacked by scripts/fetch-nixl.sh (often reached through the
	// .nixl/current symlink, so resolve links first)
	dir := l.Dir()
	if real, err := filepath.EvalSymlinks(dir); err == nil {
		dir = real
	}
	base := filepath.Base(filepath.Dir(dir))
	if i := strings.IndexByte(base, '-'); i > 0 && strings.HasPrefix(base, "cu") {
		return base[i+1:]
	}
	return ""
}

var (
	loadMu  sync.Mutex
	loaded  *Library
	loadErr error
)

// Loaded returns the library loaded by an earlier successful Load, or nil.
func Loaded() *Library {
	loadMu.Lock()
	defer loadMu.Unlock()
	return loaded
}

// LoadError is returned when NIXL cannot be loaded: every candidate tried (Tried, "path (source)") and why
// it failed (Why). It unwraps to ErrNotLoaded; it is the loaders' one shape (cuda.LoadError and
// neuron.LoadError are the same type).
type LoadError = dl.LoadError

// newLoadError starts the LoadError of a failed Load.
func newLoadError() *LoadError {
	return &LoadError{Prefix: "nixl", Library: LibraryName, Sentinel: ErrNotLoaded,
		Fix: "run `make nixl` (downloads the pinned nixl wheel from PyPI and unpacks it into .nixl/), " +
			"then set NIXL_LIB_DIR=$PWD/.nixl/current/lib, or pass LoadOptions.LibDir"}
}

// Load loads NIXL's C API library once per process and returns it. Later calls return the same Library
// (an explicit LibDir that names another folder is an error: one process has one NIXL).
func Load(opts LoadOptions) (*Library, error) {
	loadMu.Lock()
	defer loadMu.Unlock()
	log := opts.Logger
	if log == nil {
		log = zap.NewNop()
	}
	if loaded != nil {
		if opts.LibDir != "" && !sameDir(opts.LibDir, loaded.Dir()) {
			return nil, goErr("load", ErrInvalidState,
				"NIXL is already loaded from %s; a process can load only one NIXL (asked for %s)", loaded.Dir(), opts.LibDir)
		}
		return loaded, nil
	}
	raceWorkaround(log)
	dirs := depDirs(opts.DepDirs)
	deps := preloadDeps(dirs)
	for _, d := range deps {
		if d.Err != "" {
			log.Warn("plugin dependency not preloaded", zap.String("path", d.Path), zap.String("error", d.Err))
		} else {
			log.Info("plugin dependency preloaded", zap.String("path", d.Path))
		}
	}
	le := newLoadError()
	for _, cand := range candidates(opts.LibDir) {
		path, dir := cand.Path, candidateDir(cand)
		if dir != "" {
			if _, err := os.Stat(path); err != nil {
				le.Add(fmt.Sprintf("%s (%s)", path, cand.Source), "no such file")
				continue
			}
		}
		pluginDir := opts.PluginDir
		if pluginDir == "" {
			pluginDir = os.Getenv("NIXL_PLUGIN_DIR")
		}
		if pluginDir == "" && dir != "" {
			if st, err := os.Stat(filepath.Join(dir, "plugins")); err == nil && st.IsDir() {
				pluginDir = filepath.Join(dir, "plugins")
			}
		}
		if pluginDir != "" {
			// NIXL reads NIXL_PLUGIN_DIR when its plugin manager starts (the first agent); with cgo,
			// os.Setenv also updates the C environment.
			if err := os.Setenv("NIXL_PLUGIN_DIR", pluginDir); err != nil {
				return nil, goErr("load", ErrInvalidParam, "setting NIXL_PLUGIN_DIR: %w", err)
			}
		}
		why, ok := cOpen(path)
		if !ok {
			le.Add(fmt.Sprintf("%s (%s)", path, cand.Source), why)
			continue
		}
		abs := path
		if dir != "" {
			if a, err := filepath.Abs(path); err == nil {
				abs = a
			}
		} else if p := resolvedPath(); p != "" {
			abs = p
		}
		loaded = &Library{path: abs, pluginDir: os.Getenv("NIXL_PLUGIN_DIR"), custom: cHasCustomParam(),
			skipMerge: cHasSkipDescMerge(), deps: deps, depDirs: dirs, log: log}
		log.Info("NIXL loaded", zap.String("path", abs), zap.String("source", cand.Source), zap.String("plugin_dir", loaded.pluginDir))
		loadErr = nil
		return loaded, nil
	}
	loadErr = le
	return nil, loadErr
}

// candidates lists what Load tries, in order (internal/dl's one search order, as cuda and neuron): the
// explicit folder's library, $NIXL_LIB_DIR's, the dynamic loader's search path, then StandardPaths; a path
// named twice is tried once.
func candidates(explicit string) []dl.Candidate {
	inDir := func(dir string) string {
		if dir == "" {
			return ""
		}
		return filepath.Join(dir, LibraryName)
	}
	getenv := func(k string) string { return inDir(os.Getenv(k)) }
	return dl.Search("LoadOptions.LibDir", inDir(explicit), EnvLibDir, getenv, LibraryName, StandardPaths)
}

// candidateDir is the folder of a candidate named by path (where its plugins are), or "" for the bare
// library name the dynamic loader searches for.
func candidateDir(c dl.Candidate) string {
	if !strings.ContainsRune(c.Path, '/') {
		return ""
	}
	return filepath.Dir(c.Path)
}

func sameDir(a, b string) bool {
	ra, errA := filepath.EvalSymlinks(a)
	rb, errB := filepath.EvalSymlinks(b)
	if errA != nil || errB != nil {
		return filepath.Clean(a) == filepath.Clean(b)
	}
	return ra == rb
}

// resolvedPath finds where the dynamic loader found the library, from /proc/self/maps.
func resolvedPath() string {
	data, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(data), "\n") {
		if i := strings.Index(line, "/"); i >= 0 && strings.HasSuffix(line, "/"+LibraryName) {
			return line[i:]
		}
	}
	return ""
}

// raceWorkaround keeps UCX from loading its InfiniBand transport modules in binaries built with -race, unless
// UCX_MODULES is set. Those modules pull in libnl-route-3, whose ELF destructor crashes (SIGSEGV in
// rtnl_tc_unregister) when the process exits through C's exit(): the race runtime's __tsan_fini does exactly
// that, while ordinary Go binaries leave with exit_group and never run C destructors. Race builds are test
// builds, and loopback tests need no InfiniBand; set UCX_MODULES (e.g. "*") to load every module anyway.
func raceWorkaround(log *zap.Logger) {
	if !raceBuild || os.Getenv("UCX_MODULES") != "" {
		return
	}
	if err := os.Setenv("UCX_MODULES", "^ib*"); err == nil {
		log.Info("race build: UCX_MODULES=^ib* so that libnl-route's exit-time destructor (loaded by UCX's IB modules) cannot crash the process at exit")
	}
}
