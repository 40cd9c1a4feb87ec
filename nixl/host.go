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
	// HugePages asks for 2 MiB huge pages: reserved ones (MAP_HUGETLB) when the host has some free, else
	// transparent huge pages (the memory 2 MiB-aligned and madvised MADV_HUGEPAGE, which the kernel honours
	// unless /sys/kernel/mm/transparent_hugepage/enabled is "never"), else normal pages (HostMem.HugePages and
	// HostMem.TransparentHugePages say which it got). A peer READing the memory through UCX's cma pins it
	// page by page, 2 MiB at a time on huge pages (BenchmarkDRAMToDRAM, whose peer's memory is allocated so).
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
	mapped []byte // the whole mapping (b is a 2 MiB-aligned part of it with transparent huge pages), for Close
	locked bool
	huge   bool
	thp    bool
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
		b, mapped []byte
		err       error
		huge, thp bool
	)
	prot := syscall.PROT_READ | syscall.PROT_WRITE
	// MAP_POPULATE faults every page in now: a KV cache is used whole, and a transfer that lands on untouched
	// pages pays a page fault (and the kernel's zeroing) per 4 KiB, which caps its throughput.
	flags := syscall.MAP_PRIVATE | syscall.MAP_ANONYMOUS | syscall.MAP_POPULATE
	if opts.HugePages {
		hsz := (size + hugePageSize - 1) / hugePageSize * hugePageSize
		if b, err = syscall.Mmap(-1, 0, int(hsz), prot, flags|syscall.MAP_HUGETLB); err == nil {
			mapped, b = b, b[:size]
			huge = true
		} else if mapped, b, err = mmapTHP(hsz, prot); err == nil {
			b = b[:size]
			thp = true
		}
	}
	if b == nil {
		psz := int64(os.Getpagesize())
		if b, err = syscall.Mmap(-1, 0, int((size+psz-1)/psz*psz), prot, flags); err != nil {
			return nil, goErr("allocate host memory", ErrBackend, "mmap of %d bytes: %w", size, err)
		}
		mapped, b = b, b[:size]
	}
	m := &HostMem{b: b, mapped: mapped, huge: huge, thp: thp, closed: new(atomic.Bool)}
	if opts.Lock {
		if err := syscall.Mlock(b); err != nil {
			_ = syscall.Munmap(mapped)
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

// HugePages reports whether the memory is backed by reserved huge pages (MAP_HUGETLB).
func (m *HostMem) HugePages() bool { return m.huge }

// TransparentHugePages reports whether the memory was given to the kernel's transparent huge pages
// (HostOptions.HugePages without reserved huge pages): 2 MiB-aligned and madvised MADV_HUGEPAGE. Whether the
// kernel backed it so is its choice (AnonHugePages in /proc/self/smaps).
func (m *HostMem) TransparentHugePages() bool { return m.thp }

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
	b := m.b
	m.b = nil
	m.closed.Store(true)
	if m.locked {
		_ = syscall.Munlock(b)
	}
	if err := syscall.Munmap(m.mapped); err != nil {
		return goErr("free host memory", ErrBackend, "%w", err)
	}
	return nil
}

// Linux madvise advice AllocHost uses (not in package syscall).
const (
	madvHugePage      = 14 // MADV_HUGEPAGE
	madvPopulateWrite = 23 // MADV_POPULATE_WRITE (Linux 5.14)
)

// mmapTHP maps size bytes (a multiple of hugePageSize) of anonymous memory at a 2 MiB-aligned address for
// transparent huge pages: it maps hugePageSize more, returns the whole mapping (for Munmap) and its aligned
// part of size bytes, madvised MADV_HUGEPAGE and populated (MADV_POPULATE_WRITE, or by touching each page on
// kernels without it). The unaligned rest is never touched, so it takes no memory.
func mmapTHP(size int64, prot int) (mapped, b []byte, err error) {
	mapped, err = syscall.Mmap(-1, 0, int(size+hugePageSize), prot, syscall.MAP_PRIVATE|syscall.MAP_ANONYMOUS)
	if err != nil {
		return nil, nil, err
	}
	off := (hugePageSize - int64(uintptr(unsafe.Pointer(&mapped[0])))%hugePageSize) % hugePageSize
	b = mapped[off : off+size]
	if err := syscall.Madvise(b, madvHugePage); err != nil {
		_ = syscall.Munmap(mapped)
		return nil, nil, err
	}
	if syscall.Madvise(b, madvPopulateWrite) != nil {
		psz := os.Getpagesize()
		for i := 0; i < len(b); i += psz {
			b[i] = 0
		}
	}
	return mapped, b, nil
}
