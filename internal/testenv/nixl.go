package testenv

import (
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/gonixl/gonixl/nixl"
)

var nixlLib struct {
	once sync.Once
	lib  *nixl.Library
	err  error
}

// NIXL loads the real NIXL (from NIXLLibDir) once per test process and returns it; it fails/skips the test
// when the library is missing (RequireNIXLLibDir) and fails it when the library does not load.
func NIXL(tb testing.TB) *nixl.Library {
	tb.Helper()
	dir := RequireNIXLLibDir(tb)
	nixlLib.once.Do(func() { nixlLib.lib, nixlLib.err = nixl.Load(nixl.LoadOptions{LibDir: dir}) })
	if nixlLib.err != nil {
		tb.Fatalf("loading NIXL from %s: %v", dir, nixlLib.err)
	}
	return nixlLib.lib
}

var agentSeq atomic.Int64

// NIXLAgent is an agent of NIXL with the UCX backend, named prefix-<pid>-<n>; it is closed when the
// test ends, and an error closing it fails the test.
func NIXLAgent(tb testing.TB, prefix string) *nixl.Agent {
	tb.Helper()
	lib := NIXL(tb)
	name := fmt.Sprintf("%s-%d-%d", prefix, os.Getpid(), agentSeq.Add(1))
	a, err := lib.NewAgent(name, nixl.AgentConfig{Backends: []nixl.BackendSpec{{Plugin: "UCX"}}})
	if err != nil {
		tb.Fatalf("new NIXL agent %s: %v", name, err)
	}
	tb.Cleanup(func() {
		if err := a.Close(); err != nil {
			tb.Errorf("closing NIXL agent %s: %v", name, err)
		}
	})
	return a
}
