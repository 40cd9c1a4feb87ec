// Package prefixcache keeps a prefill worker's finished blocks under vLLM's block hashes (connector/blockhash),
// so that a later request sharing a prefix reuses them instead of staging them again: a bounded LRU of
// reference-counted blocks over a block pool. A cached block is shared read-only by every request that holds
// it and is only evicted (returned to the pool) while no request holds it: under allocation pressure or past
// Config.MaxBlocks. The caller reports each eviction (vLLM's BlockRemoved event) from Alloc's result.
//
// The prefill role uses it when PrefillConfig.PrefixCache is set (connector.Prefill.HoldTokens).
//
// The package builds with CGO_ENABLED=0.
package prefixcache

import (
	"container/list"
	"errors"
	"fmt"
	"sync"

	"github.com/gonixl/gonixl/connector/blockhash"
)

// Sentinel errors. Every error this package returns wraps one of them, so callers can branch with errors.Is.
var (
	// ErrNoBlocks: the pool cannot supply the blocks even after evicting every unheld cached block. Retry once
	// requests have released theirs.
	ErrNoBlocks = errors.New("prefixcache: not enough free KV blocks")
	// ErrInvalid: a call with inconsistent arguments (hashes and blocks of different lengths, a negative count,
	// a block released more often than held). Fix the caller.
	ErrInvalid = errors.New("prefixcache: invalid argument")
)

// Pool hands out and takes back block ids; connector.BlockPool is one.
type Pool interface {
	Alloc(n int) ([]int, error)
	Free(ids []int)
	Available() int
}

// Config bounds a Cache.
type Config struct {
	// MaxBlocks is the most cached blocks kept while no request holds them (the LRU's bound); held blocks do not
	// count. Zero keeps none: released blocks go back to the pool at once.
	MaxBlocks int
}

type entry struct {
	hash  blockhash.Hash
	block int
	refs  int
	lru   *list.Element // in Cache.lru while refs == 0
}

// Cache is the prefix cache of one block pool. It is safe for concurrent use.
type Cache struct {
	mu      sync.Mutex
	pool    Pool
	max     int
	byHash  map[blockhash.Hash]*entry
	byBlock map[int]*entry
	held    map[int]bool // blocks allocated by Alloc and not cached (held once, by their request)
	lru     *list.List   // unheld entries, most recently released first
}

// New returns an empty cache over pool.
func New(pool Pool, cfg Config) (*Cache, error) {
	if cfg.MaxBlocks < 0 {
		return nil, fmt.Errorf("%w: MaxBlocks %d; use 0 to keep no unheld block", ErrInvalid, cfg.MaxBlocks)
	}
	return &Cache{pool: pool, max: cfg.MaxBlocks, byHash: map[blockhash.Hash]*entry{}, byBlock: map[int]*entry{},
		held: map[int]bool{}, lru: list.New()}, nil
}

// Acquire returns the blocks of the longest cached prefix of hashes (a request's block hashes, in order), each
// now held once more by the caller; the rest of the request's blocks come from Alloc.
func (c *Cache) Acquire(hashes []blockhash.Hash) []int {
	c.mu.Lock()
	defer c.mu.Unlock()
	var blocks []int
	for _, h := range hashes {
		e, ok := c.byHash[h]
		if !ok {
			break
		}
		if e.refs == 0 {
			c.lru.Remove(e.lru)
			e.lru = nil
		}
		e.refs++
		blocks = append(blocks, e.block)
	}
	return blocks
}

// Alloc takes n fresh blocks from the pool, held once by the caller, evicting the least recently released
// unheld cached blocks first where the pool has too few. It returns the hashes it evicted (to report as
// removed), or ErrNoBlocks and evicts nothing when even evicting every unheld block would not be enough.
func (c *Cache) Alloc(n int) (blocks []int, evicted []blockhash.Hash, err error) {
	if n < 0 {
		return nil, nil, fmt.Errorf("%w: Alloc(%d)", ErrInvalid, n)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	short := n - c.pool.Available()
	if short > c.lru.Len() {
		return nil, nil, fmt.Errorf("%w: want %d, %d free and %d cached blocks evictable (raise the pool's blocks or "+
			"wait for requests to release theirs)", ErrNoBlocks, n, c.pool.Available(), c.lru.Len())
	}
	if short > 0 {
		evicted = c.evict(short)
	}
	blocks, err = c.pool.Alloc(n)
	if err != nil {
		return nil, evicted, fmt.Errorf("%w: %w", ErrNoBlocks, err)
	}
	for _, b := range blocks {
		c.held[b] = true
	}
	return blocks, evicted, nil
}

// Commit caches blocks the caller holds from Alloc under their hashes (blocks[i] holds the tokens hashes[i]
// covers; call it once they are filled) and returns the indices i whose hash it cached (to report as stored).
// A hash already cached keeps its block, and the caller's block stays uncached (it goes back to the pool
// when released). Blocks not from Alloc, or already cached, are refused and nothing is cached.
func (c *Cache) Commit(hashes []blockhash.Hash, blocks []int) (stored []int, err error) {
	if len(hashes) != len(blocks) {
		return nil, fmt.Errorf("%w: %d hashes for %d blocks", ErrInvalid, len(hashes), len(blocks))
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	seen := make(map[int]bool, len(blocks))
	for _, b := range blocks {
		if !c.held[b] || seen[b] {
			return nil, fmt.Errorf("%w: block %d is not held from Alloc (or already cached, or listed twice)", ErrInvalid, b)
		}
		seen[b] = true
	}
	for i, h := range hashes {
		if _, ok := c.byHash[h]; ok {
			continue
		}
		stored = append(stored, i)
		b := blocks[i]
		e := &entry{hash: h, block: b, refs: 1}
		delete(c.held, b)
		c.byHash[h] = e
		c.byBlock[b] = e
	}
	return stored, nil
}

// Release drops one hold of each block (from Acquire or Alloc). An uncached block goes back to the pool with
// its last hold; a cached one joins the LRU and stays cached up to Config.MaxBlocks unheld blocks (the least
// recently released beyond that are evicted, and their hashes returned).
func (c *Cache) Release(blocks []int) (evicted []blockhash.Hash, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var free []int
	for _, b := range blocks {
		if e, ok := c.byBlock[b]; ok {
			if e.refs == 0 {
				err = errors.Join(err, fmt.Errorf("%w: cached block %d released more often than held", ErrInvalid, b))
				continue
			}
			e.refs--
			if e.refs == 0 {
				e.lru = c.lru.PushFront(e)
			}
			continue
		}
		if !c.held[b] {
			err = errors.Join(err, fmt.Errorf("%w: block %d is not held", ErrInvalid, b))
			continue
		}
		delete(c.held, b)
		free = append(free, b)
	}
	if len(free) > 0 {
		c.pool.Free(free)
	}
	if over := c.lru.Len() - c.max; over > 0 {
		evicted = c.evict(over)
	}
	return evicted, err
}

// evict returns the n least recently released unheld cached blocks to the pool.
func (c *Cache) evict(n int) []blockhash.Hash {
	hashes := make([]blockhash.Hash, 0, n)
	blocks := make([]int, 0, n)
	for range n {
		e := c.lru.Remove(c.lru.Back()).(*entry)
		delete(c.byHash, e.hash)
		delete(c.byBlock, e.block)
		hashes = append(hashes, e.hash)
		blocks = append(blocks, e.block)
	}
	c.pool.Free(blocks)
	return hashes
}

// Reset evicts every cached block (returned to the pool) and returns their hashes, as vLLM's
// reset_prefix_cache does; like it, it does nothing and reports false while a request holds a cached block.
func (c *Cache) Reset() ([]blockhash.Hash, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.lru.Len() != len(c.byHash) {
		return nil, false
	}
	return c.evict(c.lru.Len()), true
}

// Stats are a cache's block counts.
type Stats struct {
	Cached   int // blocks under a hash, held or not
	Unheld   int // cached blocks no request holds (evictable)
	Uncached int // blocks held from Alloc and not cached
}

// Stats returns the current counts.
func (c *Cache) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return Stats{Cached: len(c.byHash), Unheld: c.lru.Len(), Uncached: len(c.held)}
}
