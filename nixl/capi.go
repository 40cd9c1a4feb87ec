package nixl

/*
#cgo LDFLAGS: -ldl
#include <stdlib.h>
#include "gx.h"
*/
import "C"

import (
	"strings"
	"unsafe"
)

// status is the C API's nixl_capi_status_t.
type status = C.gx_status

func goBytesFree(p unsafe.Pointer, n C.size_t) []byte {
	if p == nil {
		return nil
	}
	defer C.free(p)
	return C.GoBytes(p, C.int(n))
}

// parseParams turns "key\0value\0" pairs into a map.
func parseParams(b []byte) map[string]string {
	out := map[string]string{}
	parts := strings.Split(string(b), "\x00")
	for i := 0; i+1 < len(parts); i += 2 {
		out[parts[i]] = parts[i+1]
	}
	return out
}

func memTypes(c []C.int, n C.size_t) []MemType {
	out := make([]MemType, 0, int(n))
	for i := 0; i < int(n); i++ {
		out = append(out, MemType(c[i]))
	}
	return out
}
