package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/gonixl/gonixl/connector/protocol"
	"github.com/gonixl/gonixl/nixl"
)

// nixlFlags are the flags of every command that loads NIXL.
type nixlFlags struct {
	libDir   string
	depDirs  string
	logLevel string
}

func (n *nixlFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&n.logLevel, "nixl-log-level", "", "NIXL's own log level (TRACE, DEBUG, INFO, WARN, ERROR, FATAL; default $NIXL_LOG_LEVEL, else FATAL: "+
		"gonixl reports NIXL's errors itself)")
	fs.StringVar(&n.depDirs, "nixl-deps", "", "colon-separated folders of libraries NIXL's plugins need (LIBFABRIC: `make fabric-deps`), preloaded before NIXL; $"+nixl.EnvDepDirs+"'s follow")
	fs.StringVar(&n.libDir, "nixl-lib-dir", "", "folder of libnixl_capi.so (default: $NIXL_LIB_DIR, the loader path, then "+strings.Join(nixl.StandardPaths, ", ")+")")
}

func (n *nixlFlags) load() (*nixl.Library, error) {
	// NIXL logs to stderr from C++; keep stderr to gonixl's one line unless asked otherwise.
	if n.logLevel != "" {
		os.Setenv("NIXL_LOG_LEVEL", strings.ToUpper(n.logLevel))
	} else if _, ok := os.LookupEnv("NIXL_LOG_LEVEL"); !ok {
		os.Setenv("NIXL_LOG_LEVEL", "FATAL")
	}
	dir := n.libDir
	if dir != "" {
		// Absolute, so that the NIXL_PLUGIN_DIR nixl.Load derives from it does not depend on the working
		// directory; symlinks resolved, so that the version can be read from .nixl/cuXX-<version>/lib.
		if abs, err := filepath.Abs(dir); err == nil {
			dir = abs
		}
		if real, err := filepath.EvalSymlinks(dir); err == nil {
			dir = real
		}
	}
	return nixl.Load(nixl.LoadOptions{LibDir: dir, DepDirs: filepath.SplitList(n.depDirs)})
}

// nixlVersion is lib.Version, also when the library was found through a symlinked folder
// (.nixl/current → cu12-1.5.0).
func nixlVersion(lib *nixl.Library) string {
	if v := lib.Version(); v != "" {
		return v
	}
	real, err := filepath.EvalSymlinks(lib.Path())
	if err != nil {
		return ""
	}
	base := filepath.Base(filepath.Dir(filepath.Dir(real)))
	if i := strings.IndexByte(base, '-'); i > 0 && strings.HasPrefix(base, "cu") {
		return base[i+1:]
	}
	return ""
}

var agentSeq atomic.Int64

// throwawayAgentName names an agent this process makes for one look and closes again.
func throwawayAgentName(what string) string {
	host, _ := os.Hostname()
	return fmt.Sprintf("gonixl-%s-%s-%d-%d", what, host, os.Getpid(), agentSeq.Add(1))
}

// writeJSON prints v as indented JSON.
// writeReport prints a command's report: as indented JSON with --json, else as print writes it.
func writeReport[T any](w io.Writer, asJSON bool, rep T, print func(io.Writer, T)) error {
	if asJSON {
		return writeJSON(w, rep)
	}
	print(w, rep)
	return nil
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// profileFor accepts a vLLM version ("0.16.0", "0.33.1+cu129") or a profile name ("0.16") for builds that
// ProfileFor refuses (dev builds, release candidates).
func profileFor(v string) (protocol.Profile, error) {
	if v == "" {
		return protocol.Profile{}, usagef("--vllm-version is required (the peer's vLLM version, e.g. 0.16.0 or 0.33.0; profiles: %s)", profileNames())
	}
	p, err := protocol.ProfileFor(v)
	if err == nil {
		return p, nil
	}
	if p2, err2 := protocol.ProfileByName(v); err2 == nil {
		p2.Version = v // a forced profile hashes the string given, as a version string would be
		return p2, nil
	}
	return protocol.Profile{}, fmt.Errorf("%w: %q (profiles: %s; pass a profile name to force one)", protocol.ErrUnknownVersion, v, profileNames())
}

func profileNames() string {
	var names []string
	for _, p := range protocol.Profiles {
		names = append(names, p.Name)
	}
	return strings.Join(names, ", ")
}

// parseSize reads "4096", "4K", "4KiB", "64k", "1M", "1MiB", "2G" (binary multiples).
func parseSize(s string) (int64, error) {
	t := strings.TrimSpace(strings.ToUpper(s))
	t = strings.TrimSuffix(t, "B")
	t = strings.TrimSuffix(t, "I")
	mult := int64(1)
	if t != "" {
		switch t[len(t)-1] {
		case 'K':
			mult, t = 1<<10, t[:len(t)-1]
		case 'M':
			mult, t = 1<<20, t[:len(t)-1]
		case 'G':
			mult, t = 1<<30, t[:len(t)-1]
		}
	}
	n, err := strconv.ParseInt(t, 10, 64)
	if err != nil || n <= 0 || n > (1<<40)/mult {
		return 0, fmt.Errorf("bad size %q (want e.g. 4096, 64KiB, 1MiB, 1GiB)", s)
	}
	return n * mult, nil
}

// formatSize prints a byte count the way parseSize reads it, exact when it can be.
func formatSize(n int64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%dGiB", n>>30)
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%dMiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%dKiB", n>>10)
	}
	return fmt.Sprintf("%dB", n)
}

// humanBytes prints an approximate size.
func humanBytes(n int64) string {
	f := float64(n)
	for _, u := range []string{"B", "KiB", "MiB", "GiB", "TiB"} {
		if f < 1024 || u == "TiB" {
			if u == "B" {
				return fmt.Sprintf("%d B", n)
			}
			return fmt.Sprintf("%.1f %s", f, u)
		}
		f /= 1024
	}
	return ""
}
