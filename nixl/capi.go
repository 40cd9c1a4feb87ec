package nixl

/*
#cgo LDFLAGS: -ldl
#include <stdlib.h>
#include "gx.h"
*/
import "C"

import (
	"runtime"
	"strings"
	"time"
	"unsafe"
)

// This file is the only one that calls into C (gx.h, gx.c). Each helper is one cgo call; lists of
// descriptors, indices and options cross in one call each.

// status is the C API's nixl_capi_status_t.
type status = C.gx_status

// The handles of NIXL's C API, one Go type per kind so that one cannot be passed for another. Each is an
// opaque pointer owned by NIXL (C memory), never Go memory; nil is "none".
type (
	agentHandle    C.gx_h // nixl_capi_agent_t
	backendHandle  C.gx_h // nixl_capi_backend_t
	backendEngine  C.gx_h // the nixlBackendH* inside a backend handle, as query_xfer_backend names it
	optHandle      C.gx_h // nixl_capi_opt_args_t (nil: no options)
	paramsHandle   C.gx_h // nixl_capi_params_t
	regList        C.gx_h // nixl_capi_reg_dlist_t
	xferList       C.gx_h // nixl_capi_xfer_dlist_t
	preppedHandle  C.gx_h // nixl_capi_xfer_dlist_handle_t
	xferHandle     C.gx_h // nixl_capi_xfer_req_t
	notifMapHandle C.gx_h // nixl_capi_notif_map_t
)

// cString is a C copy of a Go string, freed by free.
type cString struct{ p *C.char }

func newCString(s string) cString { return cString{C.CString(s)} }
func (c cString) free()           { C.free(unsafe.Pointer(c.p)) }

// goBytesFree copies n bytes that NIXL's helpers malloc'ed into Go memory and frees them.
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

// Loading.

// cOpen loads the C API from path (gx_open); on failure it returns the reason.
func cOpen(path string) (string, bool) { return cLoadCall(path, false) }

// cPreload loads a dependency of NIXL's plugins globally (gx_preload); on failure it returns the reason.
func cPreload(path string) (string, bool) { return cLoadCall(path, true) }

func cLoadCall(path string, preload bool) (string, bool) {
	var errBuf [1024]C.char
	cp := C.CString(path)
	defer C.free(unsafe.Pointer(cp))
	var rc C.int
	if preload {
		rc = C.gx_preload(cp, &errBuf[0], C.size_t(len(errBuf)))
	} else {
		rc = C.gx_open(cp, &errBuf[0], C.size_t(len(errBuf)))
	}
	if rc != 0 {
		return C.GoString(&errBuf[0]), false
	}
	return "", true
}

func cHasCustomParam() bool   { return C.gx_has_custom_param() != 0 }
func cHasSkipDescMerge() bool { return C.gx_has_skip_desc_merge() != 0 }

// Agents and backends.

// agentConfig is the part of AgentConfig that NIXL's nixl_capi_agent_config_t carries.
type agentConfig struct {
	progressThread   bool
	threadSync       ThreadSync
	progressDelay    time.Duration
	captureTelemetry bool
}

func (s ThreadSync) capi() C.int {
	switch s {
	case SyncNone:
		return 0
	case SyncStrict:
		return 1
	}
	return 2
}

func cCreateAgent(name string, cfg agentConfig) (agentHandle, status) {
	ccfg := C.gx_agent_config{
		enable_prog_thread: C.bool(cfg.progressThread),
		listen_port:        8888,
		thread_sync:        cfg.threadSync.capi(),
		pthr_delay_us:      C.uint64_t(cfg.progressDelay / time.Microsecond),
		lthr_delay_us:      100000,
		capture_telemetry:  C.bool(cfg.captureTelemetry),
	}
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	var h C.gx_h
	st := C.gx_create_agent(cname, &ccfg, &h)
	return agentHandle(h), st
}

func cDestroyAgent(a agentHandle) status { return C.gx_destroy_agent(C.gx_h(a)) }

func cCreateParams() (paramsHandle, status) {
	var p C.gx_h
	st := C.gx_create_params(&p)
	return paramsHandle(p), st
}

func cParamsAdd(p paramsHandle, k, v string) status {
	ck, cv := C.CString(k), C.CString(v)
	defer C.free(unsafe.Pointer(ck))
	defer C.free(unsafe.Pointer(cv))
	return C.gx_params_add(C.gx_h(p), ck, cv)
}

func cDestroyParams(p paramsHandle) { C.gx_destroy_params(C.gx_h(p)) }

func cCreateBackend(a agentHandle, plugin string, p paramsHandle) (backendHandle, status) {
	cp := C.CString(plugin)
	defer C.free(unsafe.Pointer(cp))
	var h C.gx_h
	st := C.gx_create_backend(C.gx_h(a), cp, C.gx_h(p), &h)
	return backendHandle(h), st
}

func cDestroyBackend(b backendHandle) { C.gx_destroy_backend(C.gx_h(b)) }

func cBackendEngine(b backendHandle) backendEngine {
	return backendEngine(C.gx_backend_inner(C.gx_h(b)))
}

// cPlugins is the space-separated list of the plugins NIXL found.
func cPlugins(a agentHandle) (string, status) {
	var out *C.char
	var n C.size_t
	st := C.gx_plugins(C.gx_h(a), &out, &n)
	return string(goBytesFree(unsafe.Pointer(out), n)), st
}

// maxMemTypes bounds the memory types a plugin or backend reports.
const maxMemTypes = 8

func cPluginParams(a agentHandle, plugin string) ([]MemType, map[string]string, status) {
	cp := C.CString(plugin)
	defer C.free(unsafe.Pointer(cp))
	var mems [maxMemTypes]C.int
	var nm, n C.size_t
	var out *C.char
	st := C.gx_plugin_params(C.gx_h(a), cp, &mems[0], maxMemTypes, &nm, &out, &n)
	return memTypes(mems[:], nm), parseParams(goBytesFree(unsafe.Pointer(out), n)), st
}

func cBackendParams(a agentHandle, b backendHandle) ([]MemType, map[string]string, status) {
	var mems [maxMemTypes]C.int
	var nm, n C.size_t
	var out *C.char
	st := C.gx_backend_params(C.gx_h(a), C.gx_h(b), &mems[0], maxMemTypes, &nm, &out, &n)
	return memTypes(mems[:], nm), parseParams(goBytesFree(unsafe.Pointer(out), n)), st
}

// cBuildOpt makes one optional-args object from every option of a call (gx_build_opt).
func cBuildOpt(backends []backendHandle, notif []byte, hasNotif bool, custom []byte, noMerge bool) (optHandle, status) {
	var bp *C.gx_h
	if len(backends) > 0 {
		bp = (*C.gx_h)(unsafe.Pointer(&backends[0]))
	}
	var np, cp unsafe.Pointer
	if len(notif) > 0 {
		np = unsafe.Pointer(&notif[0])
	}
	if len(custom) > 0 {
		cp = unsafe.Pointer(&custom[0])
	}
	var h C.gx_h
	st := C.gx_build_opt(&h, bp, C.size_t(len(backends)), np, C.size_t(len(notif)), cBool(hasNotif), cp, C.size_t(len(custom)), cBool(noMerge))
	runtime.KeepAlive(backends)
	runtime.KeepAlive(notif)
	runtime.KeepAlive(custom)
	return optHandle(h), st
}

func cDestroyOpt(o optHandle) { C.gx_destroy_opt_args(C.gx_h(o)) }

func cBool(b bool) C.int {
	if b {
		return 1
	}
	return 0
}

// Descriptor lists and memory.

// descPtr views descs as the (addr, len, devID) triples the C helpers take; no copy.
func descPtr(descs []Desc) *C.uint64_t {
	if len(descs) == 0 {
		return nil
	}
	return (*C.uint64_t)(unsafe.Pointer(&descs[0]))
}

// cRegList makes a registration list of descs with metadata meta, descriptor i's being meta[ends[i-1]:ends[i]]
// (none when meta is empty); bad is the failing descriptor.
func cRegList(mem MemType, descs []Desc, meta []byte, ends []uint64) (l regList, bad int, st status) {
	var mp *C.char
	var ep *C.uint64_t
	if len(meta) > 0 {
		mp = (*C.char)(unsafe.Pointer(&meta[0]))
		ep = (*C.uint64_t)(unsafe.Pointer(&ends[0]))
	}
	var h C.gx_h
	var cbad C.size_t
	st = C.gx_reg_dlist(C.int(mem), descPtr(descs), C.size_t(len(descs)), mp, ep, &h, &cbad)
	runtime.KeepAlive(meta)
	runtime.KeepAlive(ends)
	runtime.KeepAlive(descs)
	return regList(h), int(cbad), st
}

func cDestroyRegList(l regList) { C.gx_destroy_reg_dlist(C.gx_h(l)) }

// cXferList makes a transfer descriptor list in one call; bad is the failing descriptor.
func cXferList(mem MemType, descs []Desc) (l xferList, bad int, st status) {
	var h C.gx_h
	var cbad C.size_t
	st = C.gx_xfer_dlist(C.int(mem), descPtr(descs), C.size_t(len(descs)), &h, &cbad)
	runtime.KeepAlive(descs)
	return xferList(h), int(cbad), st
}

func cDestroyXferList(l xferList) { C.gx_destroy_xfer_dlist(C.gx_h(l)) }

func cRegisterMem(a agentHandle, l regList, o optHandle) status {
	return C.gx_register_mem(C.gx_h(a), C.gx_h(l), C.gx_h(o))
}

func cDeregisterMem(a agentHandle, l regList) status {
	return C.gx_deregister_mem(C.gx_h(a), C.gx_h(l), nil)
}

// cQueryMem is one backend's answer for each of the n descriptors of l: nil where it knows nothing.
func cQueryMem(a agentHandle, l regList, o optHandle, n int) ([]map[string]string, status) {
	has := make([]C.char, n+1)
	ends := make([]C.uint64_t, n+1)
	var out *C.char
	var outLen C.size_t
	st := C.gx_query_mem(C.gx_h(a), C.gx_h(l), C.gx_h(o), C.size_t(n), &has[0], &ends[0], &out, &outLen)
	if Status(st) < 0 {
		return nil, st
	}
	flat := goBytesFree(unsafe.Pointer(out), outLen)
	res := make([]map[string]string, n)
	start := uint64(0)
	for i := 0; i < n; i++ {
		end := uint64(ends[i])
		if has[i] != 0 {
			res[i] = parseParams(flat[start:end])
		}
		start = end
	}
	return res, st
}

// Metadata and connections.

func cLocalMD(a agentHandle) ([]byte, status) {
	var p unsafe.Pointer
	var n C.size_t
	st := C.gx_get_local_md(C.gx_h(a), &p, &n)
	return goBytesFree(p, n), st
}

func cLocalPartialMD(a agentHandle, l regList, o optHandle) ([]byte, status) {
	var p unsafe.Pointer
	var n C.size_t
	st := C.gx_get_local_partial_md(C.gx_h(a), C.gx_h(l), &p, &n, C.gx_h(o))
	return goBytesFree(p, n), st
}

// cLoadRemoteMD loads md (not empty) and returns the remote agent's name.
func cLoadRemoteMD(a agentHandle, md []byte) (string, status) {
	var name *C.char
	st := C.gx_load_remote_md(C.gx_h(a), unsafe.Pointer(&md[0]), C.size_t(len(md)), &name)
	runtime.KeepAlive(md)
	if name == nil {
		return "", st
	}
	defer C.free(unsafe.Pointer(name))
	return C.GoString(name), st
}

func cInvalidateRemoteMD(a agentHandle, remote cString) status {
	return C.gx_invalidate_remote_md(C.gx_h(a), remote.p)
}

func cCheckRemoteMD(a agentHandle, remote cString, l xferList) status {
	return C.gx_check_remote_md(C.gx_h(a), remote.p, C.gx_h(l))
}

func cMakeConnection(a agentHandle, remote cString, o optHandle) status {
	return C.gx_make_connection(C.gx_h(a), remote.p, C.gx_h(o))
}

// Notifications.

func cCreateNotifMap() (notifMapHandle, status) {
	var m C.gx_h
	st := C.gx_create_notif_map(&m)
	return notifMapHandle(m), st
}

func cDestroyNotifMap(m notifMapHandle) { C.gx_destroy_notif_map(C.gx_h(m)) }

// cGetNotifs drains the agent's notifications into m and returns them as count records (parseNotifs).
func cGetNotifs(a agentHandle, m notifMapHandle, o optHandle) (raw []byte, count int, st status) {
	var buf *C.char
	var n, cnt C.size_t
	st = C.gx_get_notifs(C.gx_h(a), C.gx_h(m), C.gx_h(o), &buf, &n, &cnt)
	if Status(st) < 0 || cnt == 0 {
		C.free(unsafe.Pointer(buf))
		return nil, 0, st
	}
	return goBytesFree(unsafe.Pointer(buf), n), int(cnt), st
}

func cGenNotif(a agentHandle, remote cString, msg []byte, o optHandle) status {
	var empty [1]byte
	p := unsafe.Pointer(&empty[0])
	if len(msg) > 0 {
		p = unsafe.Pointer(&msg[0])
	}
	st := C.gx_gen_notif(C.gx_h(a), remote.p, p, C.size_t(len(msg)), C.gx_h(o))
	runtime.KeepAlive(msg)
	return st
}

// Transfers.

func cPrepXferDlist(a agentHandle, remote cString, l xferList, o optHandle) (preppedHandle, status) {
	var h C.gx_h
	st := C.gx_prep_xfer_dlist(C.gx_h(a), remote.p, C.gx_h(l), &h, C.gx_h(o))
	return preppedHandle(h), st
}

func cReleasePrepped(a agentHandle, p preppedHandle) status {
	return C.gx_release_xfer_dlist_handle(C.gx_h(a), C.gx_h(p))
}

// cIndex is a C int, the element of the index arrays MakeXfer passes.
type cIndex = C.int

// cMakeXferReq makes a request pairing li[i] of local with ri[i] of remote (both not empty).
func cMakeXferReq(a agentHandle, op Op, local preppedHandle, li []cIndex, remote preppedHandle, ri []cIndex, o optHandle) (xferHandle, status) {
	var h C.gx_h
	st := C.gx_make_xfer_req(C.gx_h(a), C.int(op), C.gx_h(local), &li[0], C.size_t(len(li)), C.gx_h(remote), &ri[0], C.size_t(len(ri)), &h, C.gx_h(o))
	runtime.KeepAlive(li)
	runtime.KeepAlive(ri)
	return xferHandle(h), st
}

func cCreateXferReq(a agentHandle, op Op, local, remote xferList, remoteAgent cString, o optHandle) (xferHandle, status) {
	var h C.gx_h
	st := C.gx_create_xfer_req(C.gx_h(a), C.int(op), C.gx_h(local), C.gx_h(remote), remoteAgent.p, &h, C.gx_h(o))
	return xferHandle(h), st
}

func cReleaseXfer(a agentHandle, x xferHandle) status { return C.gx_release_xfer(C.gx_h(a), C.gx_h(x)) }

func cPostXfer(a agentHandle, x xferHandle, o optHandle) status {
	return C.gx_post_xfer_req(C.gx_h(a), C.gx_h(x), C.gx_h(o))
}

func cXferStatus(a agentHandle, x xferHandle) status {
	return C.gx_get_xfer_status(C.gx_h(a), C.gx_h(x))
}

// cEstimateXferCost is the backend's estimate of the request's duration and its error margin.
func cEstimateXferCost(a agentHandle, x xferHandle) (duration, margin time.Duration, st status) {
	var d, e C.int64_t
	var m C.int
	st = C.gx_estimate_xfer_cost(C.gx_h(a), C.gx_h(x), nil, &d, &e, &m)
	return time.Duration(d) * time.Microsecond, time.Duration(e) * time.Microsecond, st
}

func cXferTelemetry(a agentHandle, x xferHandle) (Telemetry, status) {
	var t C.gx_telemetry
	st := C.gx_get_xfer_telemetry(C.gx_h(a), C.gx_h(x), &t)
	return Telemetry{
		Start:        time.UnixMicro(int64(t.start_time_us)),
		PostDuration: time.Duration(t.post_duration_us) * time.Microsecond,
		XferDuration: time.Duration(t.xfer_duration_us) * time.Microsecond,
		Bytes:        uint64(t.total_bytes),
		Descs:        uint64(t.desc_count),
	}, st
}

func cQueryXferBackend(a agentHandle, x xferHandle) (backendEngine, status) {
	var inner unsafe.Pointer
	st := C.gx_query_xfer_backend(C.gx_h(a), C.gx_h(x), &inner)
	return backendEngine(inner), st
}
