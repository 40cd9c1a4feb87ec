package nixl

/*
#include <stdlib.h>
#include "gx.h"
*/
import "C"

import (
	"fmt"
	"runtime"
	"strings"
	"unsafe"
)

// MemType is NIXL's memory type (nixl_mem_t).
type MemType int

// Memory types. DRAM is host memory, VRAM GPU memory (DevID = CUDA device ordinal), Block a block device,
// Object an object store key, File a file (DevID = file descriptor).
const (
	DRAM   MemType = 0 // DRAM
	VRAM   MemType = 1 // VRAM
	Block  MemType = 2 // BLOCK
	Object MemType = 3 // OBJECT
	File   MemType = 4 // FILE
)

// ParseMemType accepts NIXL's names ("DRAM", "VRAM", "BLOCK", "OBJECT", "FILE"; any case), and vLLM's
// "cpu" (DRAM) and "cuda" (VRAM).
func ParseMemType(s string) (MemType, error) {
	switch strings.ToUpper(s) {
	case "DRAM", "DRAM_SEG", "CPU":
		return DRAM, nil
	case "VRAM", "VRAM_SEG", "CUDA":
		return VRAM, nil
	case "BLOCK", "BLK", "BLK_SEG":
		return Block, nil
	case "OBJECT", "OBJ", "OBJ_SEG":
		return Object, nil
	case "FILE", "FILE_SEG":
		return File, nil
	}
	return 0, goErr("parse memory type", ErrInvalidParam, "unknown memory type %q (want DRAM, VRAM, BLOCK, OBJECT or FILE)", s)
}

func (m MemType) valid() bool { return m >= DRAM && m <= File }

// Desc is one descriptor: a byte range on a device. Its fields match layout.Desc, so nixl.Desc(d) converts.
type Desc struct {
	Addr  uint64 // start address (host or device pointer, or offset for FILE/BLOCK)
	Len   uint64 // length in bytes
	DevID uint64 // device ordinal (VRAM), 0 for DRAM, file descriptor (FILE), ...
}

// DescsOf converts a list of descriptors with Desc's field set, such as layout.Desc (Geometry.Descs,
// RemoteDescs, ...), to []Desc.
func DescsOf[D ~struct{ Addr, Len, DevID uint64 }](ds []D) []Desc {
	out := make([]Desc, len(ds))
	for i, d := range ds {
		out[i] = Desc(d)
	}
	return out
}

// RegDesc is a registration descriptor: a Desc plus per-descriptor metadata (e.g. a file path for FILE).
type RegDesc struct {
	Desc
	Meta []byte
}

// descPtr views descs as the (addr, len, devID) triples the C helpers take; no copy.
func descPtr(descs []Desc) *C.uint64_t {
	if len(descs) == 0 {
		return nil
	}
	return (*C.uint64_t)(unsafe.Pointer(&descs[0]))
}

func checkDescs(op string, mem MemType, descs []Desc) error {
	if !mem.valid() {
		return goErr(op, ErrInvalidParam, "invalid memory type %d", int(mem))
	}
	for i, d := range descs {
		if d.Len == 0 {
			return goErr(op, ErrInvalidParam, "descriptor %d has length 0", i)
		}
		if d.Addr+d.Len < d.Addr {
			return goErr(op, ErrInvalidParam, "descriptor %d (addr %#x, len %d) wraps around the address space", i, d.Addr, d.Len)
		}
	}
	return nil
}

// buildRegList makes a C registration list; the caller destroys it.
func buildRegList(op string, mem MemType, descs []RegDesc) (C.gx_h, error) {
	plain := make([]Desc, len(descs))
	var meta []byte
	var ends []uint64
	for i, d := range descs {
		plain[i] = d.Desc
		meta = append(meta, d.Meta...)
		ends = append(ends, uint64(len(meta)))
	}
	if err := checkDescs(op, mem, plain); err != nil {
		return nil, err
	}
	var mp *C.char
	var ep *C.uint64_t
	if len(meta) > 0 {
		mp = (*C.char)(unsafe.Pointer(&meta[0]))
		ep = (*C.uint64_t)(unsafe.Pointer(&ends[0]))
	}
	var h C.gx_h
	var bad C.size_t
	if err := check(op, C.gx_reg_dlist(C.int(mem), descPtr(plain), C.size_t(len(plain)), mp, ep, &h, &bad), fmt.Sprintf("descriptor %d", int(bad))); err != nil {
		return nil, err
	}
	runtime.KeepAlive(meta)
	runtime.KeepAlive(plain)
	return h, nil
}

// useRegList is useOpts plus descs as a C registration list (buildRegList), which the caller destroys or
// hands on; end releases the agent and the options.
func (a *Agent) useRegList(op string, mem MemType, descs []RegDesc, opts []Option) (l, o C.gx_h, end func(), err error) {
	if o, end, err = a.useOpts(op, opts); err != nil {
		return nil, nil, nil, err
	}
	if l, err = buildRegList(op, mem, descs); err != nil {
		end()
		return nil, nil, nil, err
	}
	return l, o, end, nil
}

// Registration is memory registered with an agent. Close deregisters it (idempotent). The memory must stay
// mapped, at the same address, until Close returns; it must never be Go heap memory (use AllocHost).
// A Registration is safe for concurrent use.
type Registration struct {
	ref   childRef
	mem   MemType
	descs []Desc
}

// MemType returns the registered memory type.
func (r *Registration) MemType() MemType { return r.mem }

// Descs returns the registered descriptors.
func (r *Registration) Descs() []Desc { return append([]Desc(nil), r.descs...) }

// Close deregisters the memory.
func (r *Registration) Close() error { return r.ref.a.closeChild(r.ref.id, "deregister memory") }

// RegisterMem registers memory regions with the agent (with every backend that serves mem, unless
// WithBackends names some). All descriptors go to NIXL in one call.
func (a *Agent) RegisterMem(mem MemType, descs []Desc, opts ...Option) (*Registration, error) {
	rd := make([]RegDesc, len(descs))
	for i, d := range descs {
		rd[i].Desc = d
	}
	return a.RegisterMemMeta(mem, rd, opts...)
}

// RegisterMemMeta is RegisterMem with per-descriptor metadata.
func (a *Agent) RegisterMemMeta(mem MemType, descs []RegDesc, opts ...Option) (*Registration, error) {
	op := "register memory"
	if len(descs) == 0 {
		return nil, goErr(op, ErrInvalidParam, "no descriptors")
	}
	l, o, end, err := a.useRegList(op, mem, descs, opts)
	if err != nil {
		return nil, err
	}
	defer end()
	detail := fmt.Sprintf("%d %s descriptor(s) on agent %s; is a backend serving %s created (CreateBackend)?", len(descs), mem, a.name, mem)
	if err := check(op, C.gx_register_mem(a.h, l, o), detail); err != nil {
		C.gx_destroy_reg_dlist(l)
		return nil, err
	}
	plain := make([]Desc, len(descs))
	for i := range descs {
		plain[i] = descs[i].Desc
	}
	id := a.addChild(&child{kind: kindRegistration, h: l, desc: fmt.Sprintf("%d %s region(s)", len(descs), mem)})
	r := &Registration{ref: childRef{a, id}, mem: mem, descs: plain}
	runtime.AddCleanup(r, func(ref childRef) { ref.leaked() }, r.ref)
	return r, nil
}

// QueryMem asks one backend (WithBackends must name exactly one) about each descriptor, e.g. whether a
// FILE exists. The result has one entry per descriptor: nil when the backend knows nothing of it.
func (a *Agent) QueryMem(mem MemType, descs []RegDesc, opts ...Option) ([]map[string]string, error) {
	op := "query memory"
	l, o, end, err := a.useRegList(op, mem, descs, opts)
	if err != nil {
		return nil, err
	}
	defer end()
	defer C.gx_destroy_reg_dlist(l)
	n := len(descs)
	has := make([]C.char, n+1)
	ends := make([]C.uint64_t, n+1)
	var out *C.char
	var outLen C.size_t
	if err := check(op, C.gx_query_mem(a.h, l, o, C.size_t(n), &has[0], &ends[0], &out, &outLen), "WithBackends must name exactly one backend"); err != nil {
		return nil, err
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
	return res, nil
}

// LocalMetadata returns the agent's metadata blob (name, connection info, registered memory) to hand to
// peers, which load it with LoadRemoteMetadata.
func (a *Agent) LocalMetadata() ([]byte, error) {
	done, err := a.use("get local metadata")
	if err != nil {
		return nil, err
	}
	defer done()
	var p unsafe.Pointer
	var n C.size_t
	if err := check("get local metadata", C.gx_get_local_md(a.h, &p, &n), a.name); err != nil {
		return nil, err
	}
	return goBytesFree(p, n), nil
}

// LocalPartialMetadata returns metadata for only the given registered descriptors (none: connection info
// only), optionally restricted to some backends.
func (a *Agent) LocalPartialMetadata(mem MemType, descs []Desc, opts ...Option) ([]byte, error) {
	op := "get local partial metadata"
	o, end, err := a.useOpts(op, opts)
	if err != nil {
		return nil, err
	}
	defer end()
	rd := make([]RegDesc, len(descs))
	for i, d := range descs {
		rd[i].Desc = d
	}
	var l C.gx_h
	if len(rd) == 0 {
		var bad C.size_t
		if err := check(op, C.gx_reg_dlist(C.int(mem), nil, 0, nil, nil, &l, &bad), ""); err != nil {
			return nil, err
		}
	} else if l, err = buildRegList(op, mem, rd); err != nil {
		return nil, err
	}
	defer C.gx_destroy_reg_dlist(l)
	var p unsafe.Pointer
	var n C.size_t
	if err := check(op, C.gx_get_local_partial_md(a.h, l, &p, &n, o), "are the descriptors registered?"); err != nil {
		return nil, err
	}
	return goBytesFree(p, n), nil
}

// LoadRemoteMetadata loads a peer's metadata blob and returns the peer agent's name.
func (a *Agent) LoadRemoteMetadata(md []byte) (string, error) {
	op := "load remote metadata"
	if len(md) == 0 {
		return "", goErr(op, ErrInvalidParam, "empty metadata blob")
	}
	done, err := a.use(op)
	if err != nil {
		return "", err
	}
	defer done()
	var name *C.char
	if err := check(op, C.gx_load_remote_md(a.h, unsafe.Pointer(&md[0]), C.size_t(len(md)), &name),
		fmt.Sprintf("%d-byte blob: is it another NIXL agent's LocalMetadata from the same NIXL version, with a backend in common?", len(md))); err != nil {
		return "", err
	}
	runtime.KeepAlive(md)
	defer C.free(unsafe.Pointer(name))
	return C.GoString(name), nil
}

// InvalidateRemoteMetadata forgets a peer's metadata and disconnects from it.
func (a *Agent) InvalidateRemoteMetadata(remote string) error {
	op := "invalidate remote metadata"
	return a.withRemote(op, remote, nil, func(cr *C.char, _ C.gx_h) error {
		return check(op, C.gx_invalidate_remote_md(a.h, cr), "agent "+remote)
	})
}

// CheckRemoteMetadata returns nil when the peer's metadata is loaded and (when descs are given) covers
// them, else an ErrNotFound error.
func (a *Agent) CheckRemoteMetadata(remote string, mem MemType, descs []Desc) error {
	op := "check remote metadata"
	return a.withRemote(op, remote, nil, func(cr *C.char, _ C.gx_h) error {
		l, err := buildXferList(op, mem, descs, true)
		if err != nil {
			return err
		}
		defer C.gx_destroy_xfer_dlist(l)
		return check(op, C.gx_check_remote_md(a.h, cr, l), "agent "+remote)
	})
}

// MakeConnection connects to a peer now instead of at its first transfer.
func (a *Agent) MakeConnection(remote string, opts ...Option) error {
	op := "make connection"
	return a.withRemote(op, remote, opts, func(cr *C.char, o C.gx_h) error {
		return check(op, C.gx_make_connection(a.h, cr, o), "agent "+remote+": load its metadata first")
	})
}

// withRemote runs fn with the agent in use, opts converted for C and remote as a C string, and releases them
// after fn.
func (a *Agent) withRemote(op, remote string, opts []Option, fn func(cr *C.char, o C.gx_h) error) error {
	o, end, err := a.useOpts(op, opts)
	if err != nil {
		return err
	}
	defer end()
	cr := C.CString(remote)
	defer C.free(unsafe.Pointer(cr))
	return fn(cr, o)
}

// buildXferList makes a C transfer descriptor list in one cgo call; the caller destroys it.
func buildXferList(op string, mem MemType, descs []Desc, allowEmpty bool) (C.gx_h, error) {
	if len(descs) == 0 && !allowEmpty {
		return nil, goErr(op, ErrInvalidParam, "no descriptors")
	}
	if err := checkDescs(op, mem, descs); err != nil {
		return nil, err
	}
	var h C.gx_h
	var bad C.size_t
	if err := check(op, C.gx_xfer_dlist(C.int(mem), descPtr(descs), C.size_t(len(descs)), &h, &bad), fmt.Sprintf("descriptor %d", int(bad))); err != nil {
		return nil, err
	}
	runtime.KeepAlive(descs)
	return h, nil
}
