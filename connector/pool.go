package connector

import (
	"errors"
	"fmt"
	"slices"
	"sync"
)

// BlockPool hands out the block ids of a cache: 1..NumBlocks-1 (block 0 is vLLM's reserved null block and is
// never handed out), always the lowest free ids, in ascending order. A request's blocks are thus one
// ascending run wherever the pool has one, which NIXL merges into one descriptor per region: descending or
// shuffled ids cost one descriptor per block, and into GPU memory one UCX rendezvous per descriptor
// (BenchmarkDRAMToVRAM, 32 KiB blocks scattered against contiguous). It is safe for concurrent use.
type BlockPool struct {
	mu    sync.Mutex
	free  []int // descending: the lowest id last
	inUse map[int]bool
	total int
}

// NewBlockPool makes a pool over numBlocks blocks.
func NewBlockPool(numBlocks int) *BlockPool {
	p := &BlockPool{inUse: map[int]bool{}, total: numBlocks}
	for id := numBlocks - 1; id >= 1; id-- {
		p.free = append(p.free, id)
	}
	return p
}

// ErrNoBlocks is wrapped by the errors of a pool that cannot satisfy an allocation: BlockPool's, and so
// Prefill.Hold's (the role owns allocation). It is transient: retry once decode peers have read their blocks
// (HTTP servers answer 503 with Retry-After).
var ErrNoBlocks = errors.New("not enough free KV blocks")

// Alloc takes n blocks, or none and ErrNoBlocks.
func (p *BlockPool) Alloc(n int) ([]int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if n < 0 || n > len(p.free) {
		return nil, fmt.Errorf("connector: %w: want %d, %d of %d free (raise num_blocks or wait for transfers to finish)", ErrNoBlocks, n, len(p.free), p.total-1)
	}
	ids := make([]int, n)
	for i := range ids {
		id := p.free[len(p.free)-1]
		p.free = p.free[:len(p.free)-1]
		p.inUse[id] = true
		ids[i] = id
	}
	return ids, nil
}

// Free returns blocks to the pool; ids not in use are ignored (so a double free cannot hand a block out twice).
func (p *BlockPool) Free(ids []int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var back []int
	for _, id := range ids {
		if p.inUse[id] {
			delete(p.inUse, id)
			back = append(back, id)
		}
	}
	if len(back) == 0 {
		return
	}
	// Merge the freed ids into the descending free list: O(free + freed·log freed) per call.
	slices.SortFunc(back, func(a, b int) int { return b - a })
	merged := make([]int, 0, len(p.free)+len(back))
	i, j := 0, 0
	for i < len(p.free) && j < len(back) {
		if p.free[i] > back[j] {
			merged = append(merged, p.free[i])
			i++
		} else {
			merged = append(merged, back[j])
			j++
		}
	}
	p.free = append(append(merged, p.free[i:]...), back[j:]...)
}

// InUse returns how many blocks are allocated.
func (p *BlockPool) InUse() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.inUse)
}

// Available returns how many blocks are free.
func (p *BlockPool) Available() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.free)
}
