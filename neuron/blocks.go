package neuron

import (
	"fmt"
	"sync"
	"time"
)

// DefaultLeaseTimeout is how long staged blocks wait for the decode peer's notification before they are
// reclaimed: vLLM's VLLM_NIXL_ABORT_REQUEST_TIMEOUT default (480 s).
const DefaultLeaseTimeout = 480 * time.Second

// PoolOptions configure a BlockPool.
type PoolOptions struct {
	// LeaseTimeout bounds how long reserved blocks stay reserved without Release (0: DefaultLeaseTimeout;
	// negative: never expire, for a caller such as the connector's prefill role that enforces its own
	// abort timeout and always calls Release).
	LeaseTimeout time.Duration
	// Now is the clock (nil: time.Now); tests inject one.
	Now func() time.Time
}

type blockState struct {
	reserved bool
	staging  bool // a Stage is writing it: not reclaimable, not releasable
	deadline time.Time
}

// BlockPool hands out block ids 1..numBlocks-1 of the staging arena (id 0 is vLLM's null block and is never
// handed out) and takes them back on Release, or when their lease expires. The connector's prefill role
// drives it: Reserve for a new request, Renew when the request's transfer parameters are published (the
// Stager does it when staging succeeds), Release on the decode peer's notification.
//
// Concurrency: safe for concurrent use.
type BlockPool struct {
	mu    sync.Mutex
	lease time.Duration
	now   func() time.Time
	free  []int // LIFO of free ids
	state []blockState
	inUse int
}

// NewBlockPool creates a pool of numBlocks blocks (≥ 2: the null block plus at least one usable).
func NewBlockPool(numBlocks int, opts PoolOptions) (*BlockPool, error) {
	if numBlocks < 2 {
		return nil, fmt.Errorf("%w: a block pool needs at least 2 blocks (block 0 is the null block), got %d", ErrBadArgument, numBlocks)
	}
	p := &BlockPool{lease: opts.LeaseTimeout, now: opts.Now, state: make([]blockState, numBlocks)}
	if p.lease == 0 {
		p.lease = DefaultLeaseTimeout
	}
	if p.now == nil {
		p.now = time.Now
	}
	p.free = make([]int, 0, numBlocks-1)
	for id := numBlocks - 1; id >= 1; id-- { // pop order 1, 2, 3, ... like a fresh vLLM pool
		p.free = append(p.free, id)
	}
	return p, nil
}

// NumBlocks is the pool size, null block included.
func (p *BlockPool) NumBlocks() int { return len(p.state) }

// Free is the number of blocks that Reserve can hand out now (expired leases not yet counted).
func (p *BlockPool) Free() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.free)
}

// Reserve hands out n distinct free block ids, reclaiming expired leases first. It reserves all n or none
// (ErrNoBlocks).
func (p *BlockPool) Reserve(n int) ([]int, error) {
	if n <= 0 {
		return nil, fmt.Errorf("%w: reserve %d blocks", ErrBadArgument, n)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now()
	if len(p.free) < n {
		p.reclaimLocked(now)
	}
	if len(p.free) < n {
		return nil, fmt.Errorf("%w: %d requested, %d free of %d (release finished requests, or size the pool larger)",
			ErrNoBlocks, n, len(p.free), len(p.state)-1)
	}
	ids := make([]int, n)
	for i := range ids {
		id := p.free[len(p.free)-1]
		p.free = p.free[:len(p.free)-1]
		p.state[id] = blockState{reserved: true, deadline: now.Add(p.lease)}
		ids[i] = id
	}
	p.inUse += n
	return ids, nil
}

// check validates ids: in range, not the null block, reserved, no duplicates, and (if notStaging) not being
// staged. It changes nothing.
func (p *BlockPool) checkLocked(ids []int, notStaging bool) error {
	seen := make(map[int]struct{}, len(ids))
	for j, id := range ids {
		switch {
		case id == 0:
			return fmt.Errorf("%w: block id 0 (position %d) is the null block", ErrBadArgument, j)
		case id < 0 || id >= len(p.state):
			return fmt.Errorf("%w: block id %d (position %d) is outside 1..%d", ErrBadArgument, id, j, len(p.state)-1)
		case !p.state[id].reserved:
			return fmt.Errorf("%w: block %d (position %d) is free (released, expired, or never reserved)", ErrNotReserved, id, j)
		case notStaging && p.state[id].staging:
			return fmt.Errorf("%w: block %d is being staged; cancel the Stage first", ErrBadArgument, id)
		}
		if _, dup := seen[id]; dup {
			return fmt.Errorf("%w: block id %d repeated", ErrBadArgument, id)
		}
		seen[id] = struct{}{}
	}
	return nil
}

// Release returns reserved blocks to the pool. All ids are checked first; on error nothing is released.
func (p *BlockPool) Release(ids []int) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.checkLocked(ids, true); err != nil {
		return err
	}
	for _, id := range ids {
		p.freeLocked(id)
	}
	return nil
}

func (p *BlockPool) freeLocked(id int) {
	p.state[id] = blockState{}
	p.free = append(p.free, id)
	p.inUse--
}

// Renew restarts the lease of reserved blocks (e.g. when the request's transfer parameters are published).
func (p *BlockPool) Renew(ids []int) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.checkLocked(ids, false); err != nil {
		return err
	}
	d := p.now().Add(p.lease)
	for _, id := range ids {
		p.state[id].deadline = d
	}
	return nil
}

// Reclaim releases every reserved block whose lease has expired (blocks being staged are skipped) and
// returns their ids.
func (p *BlockPool) Reclaim() []int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.reclaimLocked(p.now())
}

func (p *BlockPool) reclaimLocked(now time.Time) []int {
	var out []int
	if p.lease < 0 {
		return nil
	}
	for id := 1; id < len(p.state); id++ {
		s := p.state[id]
		if s.reserved && !s.staging && !now.Before(s.deadline) {
			p.freeLocked(id)
			out = append(out, id)
		}
	}
	return out
}

// Reserved reports whether id is currently reserved.
func (p *BlockPool) Reserved(id int) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return id > 0 && id < len(p.state) && p.state[id].reserved
}

// beginStaging marks reserved, not-being-staged ids as staging (all or nothing).
func (p *BlockPool) beginStaging(ids []int) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.checkLocked(ids, true); err != nil {
		return err
	}
	for _, id := range ids {
		p.state[id].staging = true
	}
	return nil
}

// endStaging clears the staging mark; with renew the leases restart.
func (p *BlockPool) endStaging(ids []int, renew bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	d := p.now().Add(p.lease)
	for _, id := range ids {
		p.state[id].staging = false
		if renew {
			p.state[id].deadline = d
		}
	}
}
