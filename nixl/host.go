package nixl

import (
	"fmt"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"
)

// HostOptions tune AllocHost.
type HostOptions struct {
	// Lock pins the pages in RAM (mlock), so they are never swapped while registered.
	Lock bool
	// HugePages asks for 2 MiB huge pages; when none are available it falls back to normal pages
	// (HostMem.HugePages says which it got).
	HugePages bool
	// MaxBytes refuses sizes above it (0: 1 TiB), so a geometry mistake fails here with a clear error
	// instead of exhausting memory.
	MaxBytes int64
}

// HostMem is page-aligned host memory from mmap, outside the Go heap, suitable for NIXL registration as
// DRAM. Its pages are populated when it is allocated. Close unmaps it (idempotent); deregister it first. Bytes and Addr stay valid until Close.
// A HostMem is safe for concurrent use; the bytes themselves are the caller's to synchronise.
type HostMem struct {
	mu     sync.Mutex
	b      []byte
	locked bool
	huge   bool
	closed *atomic.Bool // shared with the leak cleanup, which must not reference the HostMem
}

const hugePageSize = 2 << 20

// AllocHost maps size bytes of zeroed, page-aligned anonymous memory.
func AllocHost(size int64, opts HostOptions) (*HostMem, error) {
	limit := opts.MaxBytes
	if limit <= 0 {
		limit = 1 << 40
	}
	if size <= 0 || size > limit {
		return nil, goErr("allocate host memory", ErrInvalidParam, "size %d bytes is outside (0, %d]; check the cache geometry", size, limit)
	}
	var (
		b    []byte
		err  error
		huge bool
	)
	prot := syscall.PROT_READ | syscall.PROT_WRITE
	// MAP_POPULATE faults every page in now: a KV cache is used whole, and a transfer that lands on untouched
	// pages pays a page fault (and the kernel's zeroing) per 4 KiB, which caps its throughput.
	flags := syscall.MAP_PRIVATE | syscall.MAP_ANONYMOUS | syscall.MAP_POPULATE
	if opts.HugePages {
		hsz := (size + hugePageSize - 1) / hugePageSize * hugePageSize
		if b, err = syscall.Mmap(-1, 0, int(hsz), prot, flags|syscall.MAP_HUGETLB); err == nil {
			b = b[:size]
			huge = true
		}
	}
	if b == nil {
		psz := int64(os.Getpagesize())
		if b, err = syscall.Mmap(-1, 0, int((size+psz-1)/psz*psz), prot, flags); err != nil {
			return nil, goErr("allocate host memory", ErrBackend, "mmap of %d bytes: %w", size, err)
		}
		b = b[:size]
	}
	m := &HostMem{b: b, huge: huge, closed: new(atomic.Bool)}
	if opts.Lock {
		if err := syscall.Mlock(b); err != nil {
			_ = syscall.Munmap(b[:cap(b)])
			return nil, goErr("allocate host memory", ErrBackend,
				"mlock of %d bytes: %w (raise RLIMIT_MEMLOCK, e.g. `ulimit -l unlimited`, or allocate without Lock)", size, err)
		}
		m.locked = true
	}
	n := len(b)
	runtime.AddCleanup(m, func(closed *atomic.Bool) {
		if !closed.Load() {
			reportLeak(Leak{Kind: "host memory", What: fmt.Sprintf("%d bytes never unmapped", n)})
		}
	}, m.closed)
	return m, nil
}

// Bytes returns the memory as a slice (nil after Close).
func (m *HostMem) Bytes() []byte {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.b
}

// Addr returns the start address (0 after Close).
func (m *HostMem) Addr() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.b == nil {
		return 0
	}
	return uint64(uintptr(unsafe.Pointer(&m.b[0])))
}

// Len returns the size in bytes.
func (m *HostMem) Len() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return int64(len(m.b))
}

// HugePages reports whether the memory is backed by huge pages.
func (m *HostMem) HugePages() bool { return m.huge }

// Locked reports whether the memory is mlocked.
func (m *HostMem) Locked() bool { return m.locked }

// Desc returns a DRAM descriptor covering the whole allocation.
func (m *HostMem) Desc() Desc { return Desc{Addr: m.Addr(), Len: uint64(m.Len())} }

// Close unmaps the memory. It is idempotent.
func (m *HostMem) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.b == nil {
		return nil
	}
	b := m.b[:cap(m.b)]
	m.b = nil
	m.closed.Store(true)
	if m.locked {
		_ = syscall.Munlock(b)
	}
	if err := syscall.Munmap(b); err != nil {
		return goErr("free host memory", ErrBackend, "%w", err)
	}
	return nil
}
