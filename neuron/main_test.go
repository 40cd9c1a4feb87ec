package neuron

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"go.uber.org/goleak"

	"github.com/gonixl/gonixl/neuron/neurontest"
)

// fakeLib and fakeOldLib are the fake libnrt builds shared by all tests of this package (built once, in a
// temporary folder, by TestMain).
var fakeLib, fakeOldLib string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "gonixl-fakenrt-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := func() int {
		defer os.RemoveAll(dir)
		if fakeLib, err = neurontest.Build(filepath.Join(dir, "current")); err != nil {
			fmt.Fprintln(os.Stderr, "building the fake libnrt:", err)
			return 1
		}
		if fakeOldLib, err = neurontest.BuildOldRuntime(filepath.Join(dir, "old")); err != nil {
			fmt.Fprintln(os.Stderr, "building the old-runtime fake libnrt:", err)
			return 1
		}
		return runWithGoleak(m)
	}()
	os.Exit(code)
}

func runWithGoleak(m *testing.M) (code int) {
	// goleak.VerifyTestMain calls os.Exit; run the same check without exiting so the temp folder is removed.
	code = m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	return code
}

// openFake opens the fake libnrt (path, or the current build) and closes it when the test ends.
func openFake(tb testing.TB, opts LoadOptions) *Runtime {
	tb.Helper()
	if opts.Path == "" {
		opts.Path = fakeLib
	}
	r, err := Load(opts)
	if err != nil {
		tb.Fatalf("Load fake libnrt: %v", err)
	}
	tb.Cleanup(func() { _ = r.Close() })
	return r
}

func ctl(tb testing.TB, r *Runtime, key string) int64 {
	tb.Helper()
	v, ok := r.fakeCtl(key, 0, false)
	if !ok || v < 0 {
		tb.Fatalf("fake libnrt has no counter %q", key)
	}
	return v
}

func setCtl(tb testing.TB, r *Runtime, key string, v int64) {
	tb.Helper()
	if got, ok := r.fakeCtl(key, v, true); !ok || got != v {
		tb.Fatalf("set fake knob %q=%d: got %d", key, v, got)
	}
}
