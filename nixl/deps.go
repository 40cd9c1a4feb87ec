package nixl

import (
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// EnvDepDirs names the environment variable listing (colon-separated) folders of plugin dependencies that
// Load preloads, after LoadOptions.DepDirs: `make fabric-deps` fills one with what NIXL's LIBFABRIC plugin
// needs beside NIXL (libfabric.so.1, libhwloc.so.15, libcudart, a libcuda.so.1 stand-in where no driver is)
// and the Makefile exports it, so nobody sets LD_LIBRARY_PATH.
const EnvDepDirs = "GONIXL_NIXL_DEPS"

// Dep is one library Load preloaded from a dependency folder, or failed to.
type Dep struct {
	// Path is the file (as listed in its folder).
	Path string
	// Soname is the file name the plugins' DT_NEEDED entries match, e.g. "libfabric.so.1".
	Soname string
	// Err is dlopen's reason when it could not be loaded ("" when loaded).
	Err string
}

// Deps returns the libraries Load preloaded from LoadOptions.DepDirs and $GONIXL_NIXL_DEPS, in the order
// loaded, then those that failed.
func (l *Library) Deps() []Dep { return append([]Dep(nil), l.deps...) }

// DepDirs returns the dependency folders Load preloaded from (LoadOptions.DepDirs, then $GONIXL_NIXL_DEPS's).
func (l *Library) DepDirs() []string { return append([]string(nil), l.depDirs...) }

// depDirs is the dependency folders of a Load: the explicit ones, then $GONIXL_NIXL_DEPS's, each once.
func depDirs(explicit []string) []string {
	var out []string
	seen := map[string]bool{}
	for _, d := range append(append([]string(nil), explicit...), filepath.SplitList(os.Getenv(EnvDepDirs))...) {
		if d = filepath.Clean(d); d != "." && !seen[d] {
			seen[d] = true
			out = append(out, d)
		}
	}
	return out
}

// depFiles lists the shared libraries of the folders (lib*.so and lib*.so.*), one per real file (a symlink to
// a file already listed, such as libcudart.so → libcudart.so.12, is dropped), sorted by name per folder.
// A folder that cannot be read yields a Dep with its error.
func depFiles(dirs []string) (files []string, bad []Dep) {
	seen := map[string]bool{}
	for _, dir := range dirs {
		ents, err := os.ReadDir(dir)
		if err != nil {
			bad = append(bad, Dep{Path: dir, Err: "dependency folder: " + err.Error()})
			continue
		}
		names := make([]string, 0, len(ents))
		for _, e := range ents {
			n := e.Name()
			if strings.HasPrefix(n, "lib") && (strings.HasSuffix(n, ".so") || strings.Contains(n, ".so.")) {
				names = append(names, n)
			}
		}
		// Versioned names first, so that a symlink's target is the one kept.
		sort.Slice(names, func(i, j int) bool {
			vi, vj := strings.Contains(names[i], ".so."), strings.Contains(names[j], ".so.")
			if vi != vj {
				return vi
			}
			return names[i] < names[j]
		})
		for _, n := range names {
			p := filepath.Join(dir, n)
			real, err := filepath.EvalSymlinks(p)
			if err != nil {
				bad = append(bad, Dep{Path: p, Soname: n, Err: err.Error()})
				continue
			}
			if st, err := os.Stat(real); err != nil || !st.Mode().IsRegular() || seen[real] {
				continue
			}
			seen[real] = true
			files = append(files, p)
		}
	}
	return files, bad
}

// preloadDeps dlopens every library of the folders with RTLD_GLOBAL, in passes, so that one needing another of
// the set loads once that one is in (the order of the files does not matter); it stops when a pass loads
// nothing more. Loaded libraries stay for the life of the process.
func preloadDeps(dirs []string) []Dep {
	files, bad := depFiles(dirs)
	var done []Dep
	why := map[string]string{}
	for len(files) > 0 {
		var left []string
		for _, p := range files {
			reason, ok := cPreload(p)
			if !ok {
				why[p] = reason
				left = append(left, p)
				continue
			}
			done = append(done, Dep{Path: p, Soname: filepath.Base(p)})
		}
		if len(left) == len(files) {
			break
		}
		files = left
	}
	for _, p := range files {
		if why[p] != "" {
			bad = append(bad, Dep{Path: p, Soname: filepath.Base(p), Err: why[p]})
		}
	}
	return append(done, bad...)
}
