package nixl

import (
	"fmt"
	"runtime"
	"strings"
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
func buildRegList(op string, mem MemType, descs []RegDesc) (regList, error) {
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
	h, bad, st := cRegList(mem, plain, meta, ends)
	if err := check(op, st, fmt.Sprintf("descriptor %d", bad)); err != nil {
		return nil, err
	}
	return h, nil
}

// useRegList is useOpts plus descs as a C registration list (buildRegList), which the caller destroys or
// hands on; end releases the agent and the options.
func (a *Agent) useRegList(op string, mem MemType, descs []RegDesc, opts []Option) (l regList, o optHandle, end func(), err error) {
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
	if err := check(op, cRegisterMem(a.h, l, o), detail); err != nil {
		cDestroyRegList(l)
		return nil, err
	}
	plain := make([]Desc, len(descs))
	for i := range descs {
		plain[i] = descs[i].Desc
	}
	id := a.addChild(&child{kind: kindRegistration, reg: l, desc: fmt.Sprintf("%d %s region(s)", len(descs), mem)})
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
	defer cDestroyRegList(l)
	res, st := cQueryMem(a.h, l, o, len(descs))
	if err := check(op, st, "WithBackends must name exactly one backend"); err != nil {
		return nil, err
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
	md, st := cLocalMD(a.h)
	if err := check("get local metadata", st, a.name); err != nil {
		return nil, err
	}
	return md, nil
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
	var l regList
	if len(rd) == 0 {
		var st status
		l, _, st = cRegList(mem, nil, nil, nil)
		if err := check(op, st, ""); err != nil {
			return nil, err
		}
	} else if l, err = buildRegList(op, mem, rd); err != nil {
		return nil, err
	}
	defer cDestroyRegList(l)
	md, st := cLocalPartialMD(a.h, l, o)
	if err := check(op, st, "are the descriptors registered?"); err != nil {
		return nil, err
	}
	return md, nil
}

// LoadRemoteMetadata loads a peer's metadata blob and returns the peer agent's name. A blob whose memory
// sections NIXL fails to load (e.g. one cut short) leaves its backends connected to the name it claims, and
// every later load under that name is refused (ErrInvalidParam) until the agent is closed (NIXL 1.5.0): load
// blobs from untrusted peers under names of your own (RenameMetadata).
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
	name, st := cLoadRemoteMD(a.h, md)
	if err := check(op, st,
		fmt.Sprintf("%d-byte blob: is it another NIXL agent's LocalMetadata from the same NIXL version, with a backend in common?", len(md))); err != nil {
		return "", err
	}
	return name, nil
}

// InvalidateRemoteMetadata forgets a peer's metadata and disconnects from it.
func (a *Agent) InvalidateRemoteMetadata(remote string) error {
	op := "invalidate remote metadata"
	return a.withRemote(op, remote, nil, func(cr cString, _ optHandle) error {
		return check(op, cInvalidateRemoteMD(a.h, cr), "agent "+remote)
	})
}

// CheckRemoteMetadata returns nil when the peer's metadata is loaded and (when descs are given) covers
// them, else an ErrNotFound error.
func (a *Agent) CheckRemoteMetadata(remote string, mem MemType, descs []Desc) error {
	op := "check remote metadata"
	return a.withRemote(op, remote, nil, func(cr cString, _ optHandle) error {
		l, err := buildXferList(op, mem, descs, true)
		if err != nil {
			return err
		}
		defer cDestroyXferList(l)
		return check(op, cCheckRemoteMD(a.h, cr, l), "agent "+remote)
	})
}

// MakeConnection connects to a peer now instead of at its first transfer.
func (a *Agent) MakeConnection(remote string, opts ...Option) error {
	op := "make connection"
	return a.withRemote(op, remote, opts, func(cr cString, o optHandle) error {
		return check(op, cMakeConnection(a.h, cr, o), "agent "+remote+": load its metadata first")
	})
}

// withRemote runs fn with the agent in use, opts converted for C and remote as a C string, and releases them
// after fn.
func (a *Agent) withRemote(op, remote string, opts []Option, fn func(cr cString, o optHandle) error) error {
	o, end, err := a.useOpts(op, opts)
	if err != nil {
		return err
	}
	defer end()
	cr := newCString(remote)
	defer cr.free()
	return fn(cr, o)
}

// buildXferList makes a C transfer descriptor list in one cgo call; the caller destroys it.
func buildXferList(op string, mem MemType, descs []Desc, allowEmpty bool) (xferList, error) {
	if len(descs) == 0 && !allowEmpty {
		return nil, goErr(op, ErrInvalidParam, "no descriptors")
	}
	if err := checkDescs(op, mem, descs); err != nil {
		return nil, err
	}
	h, bad, st := cXferList(mem, descs)
	if err := check(op, st, fmt.Sprintf("descriptor %d", bad)); err != nil {
		return nil, err
	}
	return h, nil
}
