package nixl_test

import "runtime"

func runtimeGC() { runtime.GC() }
