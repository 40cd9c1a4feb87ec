package testenv

import (
	"sync"
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
