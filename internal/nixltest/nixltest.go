// Package nixltest loads the real NIXL for gonixl's tests, once per test process, and makes test agents on
// it. It is apart from internal/testenv, which stays pure Go for the packages whose tests run with
// CGO_ENABLED=0.
package nixltest

import (
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/gonixl/gonixl/internal/testenv"
	"github.com/gonixl/gonixl/nixl"
)

var nixlLib struct {
	once sync.Once
	lib  *nixl.Library
	err  error
}

// Lib loads the real NIXL (from testenv.NIXLLibDir) once per test process and returns it; it fails/skips the
// test when the library is missing (testenv.RequireNIXLLibDir) and fails it when the library does not load.
func Lib(tb testing.TB) *nixl.Library {
	tb.Helper()
	dir := testenv.RequireNIXLLibDir(tb)
	nixlLib.once.Do(func() { nixlLib.lib, nixlLib.err = nixl.Load(nixl.LoadOptions{LibDir: dir}) })
	if nixlLib.err != nil {
		tb.Fatalf("loading NIXL from %s: %v", dir, nixlLib.err)
	}
	return nixlLib.lib
}

var agentSeq atomic.Int64

// Agent is an agent of Lib with the UCX backend, named prefix-<pid>-<n>; it is closed when the test ends,
// and an error closing it fails the test.
func Agent(tb testing.TB, prefix string) *nixl.Agent {
	tb.Helper()
	lib := Lib(tb)
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
