package connector

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/gonixl/gonixl/connector/blockhash"
	"github.com/gonixl/gonixl/connector/kvevents"
	"github.com/gonixl/gonixl/connector/prefixcache"
	"github.com/gonixl/gonixl/connector/protocol"
	"github.com/gonixl/gonixl/layout"
)

// PrefixCacheConfig turns on prefix reuse in the prefill role (PrefillConfig.PrefixCache): the full blocks of
// every prompt stay cached under vLLM's block hashes after their decode peers have read them, and a request
// whose prompt starts with cached blocks (HoldTokens) is served from them, staging only the rest.
type PrefixCacheConfig struct {
	// MaxBlocks bounds the cached blocks no request holds (least recently used evicted first). Zero: no bound
	// but the pool's, as in vLLM: cached blocks are evicted only when an allocation needs them. Negative is
	// refused.
	MaxBlocks int
	// Algo is the engines' --prefix-caching-hash-algo; "" means the release's default (sha256).
	Algo blockhash.Algo
	// PythonHashSeed is the engines' PYTHONHASHSEED, nil when it is not set. vLLM 0.16–0.26 with it unset seed
	// their hashes from random bytes per process, which nobody else can reproduce: the role then draws its
	// own random seed (and logs it), so reuse works within the worker but its hashes match no engine's.
	PythonHashSeed *string
	// Release overrides the block-hash row; nil: blockhash.ReleaseFor(Profile.Version). Set it for a
	// profile without a version string (a dev build).
	Release *blockhash.Release
}

// KVEventsConfig makes the prefill role publish vLLM-format KV events (PrefillConfig.KVEvents, which needs
// PrefixCache): BlockStored when blocks enter the prefix cache, BlockRemoved when they are evicted,
// AllBlocksCleared when the role closes, on a ZMQ PUB socket as vLLM's --kv-events-config publisher
// (kvevents.Publisher), so that a KV-aware router (NVIDIA Dynamo's, vLLM's subscribers) follows the cache.
type KVEventsConfig struct {
	// Addr is the PUB socket's TCP address, vLLM's endpoint ("tcp://*:5557" there is ":5557" here). Empty:
	// "127.0.0.1:0", a free loopback port (Prefill.KVEventsAddr).
	Addr string
	// ReplayAddr is the replay ROUTER socket's TCP address (vLLM's replay_endpoint). Empty: no replay socket.
	ReplayAddr string
	// Topic is every message's first frame (vLLM's topic; "" by default).
	Topic string
	// DataParallelRank is written into every batch (vLLM writes its engine's DP rank).
	DataParallelRank int64
	// Format names the wire format (kvevents.FormatByName: "0.16", "0.20", "0.26", "0.29", "0.32", "0.33").
	// Empty: the format of Profile.Version (kvevents.FormatFor), which is refused for a release whose
	// format has not been read; name the consumer's format then.
	Format string
	// BytesHashes publishes each block hash as its 32 bytes, as vLLM does with
	// VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0. False: the low 64 bits as an int, vLLM's default.
	BytesHashes bool
	// Medium is the events' medium. Empty: "GPU", what vLLM's GPU block pool reports.
	Medium string
	// BufferSteps and HWM bound replay and each subscriber's queue (kvevents.Config; their defaults when 0).
	BufferSteps, HWM int
}

// PrefixFillFunc puts a request's KV into the cache at blockIDs (in token order), except the first from
// blocks, which hold a cached prefix and must not be written (they may be read by other requests' decode
// peers meanwhile). It returns only when every block it writes is complete.
type PrefixFillFunc func(ctx context.Context, blockIDs []int, from int) error

// prefixState is the prefill role's prefix cache and event publisher. mu serialises the cache's mutations
// with the events that report them, so that events are published in the order the cache changed. Lock
// order: Prefill.mu before mu.
type prefixState struct {
	mu      sync.Mutex
	cache   *prefixcache.Cache
	hasher  *blockhash.Hasher
	pub     *kvevents.Publisher // nil without KVEvents
	format  kvevents.Format
	bytesH  bool
	medium  string
	metrics *Metrics
	log     *zap.Logger
	dropped uint64 // the publisher's Stats().Dropped last copied into metrics
	closed  bool   // close ran: nothing more is published
}

// newPrefixState builds the prefix cache over pool and, with cfg.KVEvents, starts the publisher. Nil without
// cfg.PrefixCache.
func newPrefixState(cfg PrefillConfig, geom layout.Geometry, pool *BlockPool, m *Metrics, log *zap.Logger) (*prefixState, error) {
	pc := cfg.PrefixCache
	if pc == nil {
		if cfg.KVEvents != nil {
			return nil, errors.New("connector: PrefillConfig.KVEvents needs PrefixCache: events report the prefix cache's blocks")
		}
		return nil, nil
	}
	if pc.MaxBlocks < 0 {
		return nil, fmt.Errorf("connector: PrefixCacheConfig.MaxBlocks is %d: set 0 (bounded by the pool) or a positive bound", pc.MaxBlocks)
	}
	rel := pc.Release
	if rel == nil {
		r, err := blockhash.ReleaseFor(cfg.Profile.Version)
		if err != nil {
			return nil, fmt.Errorf("connector: PrefixCacheConfig: vLLM %q: %w (set PrefixCacheConfig.Release)", cfg.Profile.Version, err)
		}
		rel = &r
	}
	hcfg := blockhash.Config{Release: *rel, Algo: pc.Algo, PythonHashSeed: pc.PythonHashSeed, BlockSize: geom.BlockSize}
	hasher, err := blockhash.New(hcfg)
	if errors.Is(err, blockhash.ErrNotReproducible) {
		var b [16]byte
		_, _ = rand.Read(b[:])
		seed := hex.EncodeToString(b[:])
		hcfg.PythonHashSeed = &seed
		log.Warn("vLLM's block hashes are random per process for this release without PYTHONHASHSEED: the prefix cache uses a random seed, so its hashes (and KV events) match no engine's; set PYTHONHASHSEED on the engines and PrefixCacheConfig.PythonHashSeed alike",
			zap.String("vllm_version", cfg.Profile.Version))
		hasher, err = blockhash.New(hcfg)
	}
	if err != nil {
		return nil, fmt.Errorf("connector: PrefixCacheConfig: %w", err)
	}
	maxBlocks := pc.MaxBlocks
	if maxBlocks == 0 {
		maxBlocks = geom.NumBlocks
	}
	cache, err := prefixcache.New(pool, prefixcache.Config{MaxBlocks: maxBlocks})
	if err != nil {
		return nil, fmt.Errorf("connector: PrefixCacheConfig: %w", err)
	}
	s := &prefixState{cache: cache, hasher: hasher, metrics: m, log: log}
	if ev := cfg.KVEvents; ev != nil {
		f, err := eventFormat(cfg, ev)
		if err != nil {
			return nil, err
		}
		addr := ev.Addr
		if addr == "" {
			addr = "127.0.0.1:0"
		}
		pub, err := kvevents.New(kvevents.Config{Format: f, Addr: addr, ReplayAddr: ev.ReplayAddr, Topic: ev.Topic,
			DataParallelRank: ev.DataParallelRank, BufferSteps: ev.BufferSteps, HWM: ev.HWM})
		if err != nil {
			return nil, fmt.Errorf("connector: KVEventsConfig: %w", err)
		}
		s.pub, s.format, s.bytesH, s.medium = pub, f, ev.BytesHashes, ev.Medium
		m.addPublisher(pub)
		if s.medium == "" {
			s.medium = "GPU"
		}
		log.Info("publishing KV events", zap.Stringer("endpoint", pub.Addr()), zap.Any("replay", pub.ReplayAddr()),
			zap.String("format", f.Name))
	}
	return s, nil
}

func eventFormat(cfg PrefillConfig, ev *KVEventsConfig) (kvevents.Format, error) {
	if ev.Format != "" {
		f, err := kvevents.FormatByName(ev.Format)
		if err != nil {
			return f, fmt.Errorf("connector: KVEventsConfig.Format: %w", err)
		}
		return f, nil
	}
	f, err := kvevents.FormatFor(cfg.Profile.Version)
	if err != nil {
		return f, fmt.Errorf("connector: KVEventsConfig: %w (name the consumers' format in KVEventsConfig.Format)", err)
	}
	return f, nil
}

// alloc takes the blocks of a request of numTokens tokens: with tokens (HoldTokens) those of its longest
// cached prefix first (at most (numTokens-1)/BlockSize blocks, as vLLM leaves the last token to compute),
// then new ones. It returns the blocks, the hashes of the prompt's full blocks and how many blocks hit.
func (s *prefixState) alloc(need int, tokens []int64, salt string) (blocks []int, hashes []blockhash.Hash, hits int, err error) {
	if tokens != nil {
		if hashes, err = s.hasher.Hashes(tokens, salt); err != nil {
			return nil, nil, 0, fmt.Errorf("connector: block hashes: %w", err)
		}
	}
	maxHit := 0
	if len(tokens) > 0 {
		maxHit = min(len(hashes), (len(tokens)-1)/s.hasher.BlockSize())
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	hit := s.cache.Acquire(hashes[:maxHit])
	rest, evicted, err := s.cache.Alloc(need - len(hit))
	if err != nil {
		ev, _ := s.cache.Release(hit)
		s.removedLocked(ev)
		return nil, nil, 0, err
	}
	s.removedLocked(evicted)
	if tokens != nil {
		s.metrics.prefixQueries.Add(int64(len(tokens)))
		h := int64(len(hit) * s.hasher.BlockSize())
		s.metrics.prefixHits.Add(h)
		s.metrics.prefixMisses.Add(int64(len(tokens)) - h)
	}
	return append(hit, rest...), hashes, len(hit), nil
}

// commit caches the request's filled full blocks from index from on (the hits are cached already) and
// publishes what was stored.
func (s *prefixState) commit(blocks []int, hashes []blockhash.Hash, from int, tokens []int64, salt string) error {
	if from >= len(hashes) {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	stored, err := s.cache.Commit(hashes[from:], blocks[from:len(hashes)])
	if err != nil {
		return err
	}
	s.syncGaugeLocked()
	if s.pub == nil || len(stored) == 0 {
		return nil
	}
	var events []kvevents.Event
	bs := s.hasher.BlockSize()
	for i := 0; i < len(stored); {
		j := i + 1 // stored[i:j] is one run of consecutive blocks
		for j < len(stored) && stored[j] == stored[j-1]+1 {
			j++
		}
		a, b := from+stored[i], from+stored[j-1]+1
		ev := &kvevents.BlockStored{TokenIDs: tokens[a*bs : b*bs], BlockSize: bs, Medium: kvevents.Ptr(s.medium)}
		for k := a; k < b; k++ {
			ev.BlockHashes = append(ev.BlockHashes, s.eventHash(hashes[k]))
		}
		if a > 0 {
			ev.ParentBlockHash = kvevents.Ptr(s.eventHash(hashes[a-1]))
		}
		if s.format.StoredHas("extra_keys") { // one entry per block: the cache_salt on the first block, bare
			ev.ExtraKeys = make([][]any, b-a)
			if a == 0 && salt != "" {
				ev.ExtraKeys[0] = []any{salt}
			}
		}
		if s.format.StoredHas("group_idx") {
			ev.GroupIdx = kvevents.Ptr(int64(0))
		}
		events = append(events, ev)
		i = j
	}
	s.publishLocked(events...)
	return nil
}

// release drops a request's hold of its blocks (uncached ones go back to the pool) and reports evictions.
func (s *prefixState) release(blocks []int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	evicted, err := s.cache.Release(blocks)
	if err != nil {
		s.log.Error("prefix cache release", zap.Error(err)) // a bug: the role releases only what it holds
	}
	s.removedLocked(evicted) // a release changes the cached count only by what it evicts
}

// reset evicts every cached block (back to the pool) and publishes AllBlocksCleared. Called while no request
// holds blocks (Reregister, Close).
func (s *prefixState) reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.resetLocked()
}

func (s *prefixState) resetLocked() {
	evicted, ok := s.cache.Reset()
	if !ok {
		s.log.Warn("prefix cache: blocks still held at a reset; they stay cached")
	}
	s.metrics.prefixEvictions.Add(int64(len(evicted)))
	s.syncGaugeLocked()
	s.publishLocked(&kvevents.AllBlocksCleared{})
}

// close resets the cache and closes the publisher (which lingers for its subscribers, so AllBlocksCleared
// reaches them). Called once no request holds blocks.
func (s *prefixState) close() error {
	s.mu.Lock()
	s.resetLocked()
	s.closed = true
	s.mu.Unlock()
	if s.pub == nil {
		return nil
	}
	err := s.pub.Close()
	s.syncDropped()
	s.metrics.removePublisher(s.pub)
	return err
}

func (s *prefixState) removedLocked(evicted []blockhash.Hash) {
	if len(evicted) == 0 {
		return
	}
	s.metrics.prefixEvictions.Add(int64(len(evicted)))
	s.syncGaugeLocked()
	ev := &kvevents.BlockRemoved{Medium: kvevents.Ptr(s.medium)}
	for _, h := range evicted {
		ev.BlockHashes = append(ev.BlockHashes, s.eventHash(h))
	}
	if s.format.RemovedHas("group_idx") {
		ev.GroupIdx = kvevents.Ptr(int64(0))
	}
	s.publishLocked(ev)
}

func (s *prefixState) publishLocked(events ...kvevents.Event) {
	if s.pub == nil || s.closed {
		return
	}
	ts := float64(time.Now().UnixNano()) / 1e9
	if _, err := s.pub.Publish(kvevents.Batch{TS: ts, Events: events}); err != nil {
		s.log.Warn("KV events not published", zap.Error(err))
		return
	}
	s.metrics.kvEventsPublished.Add(1)
	s.syncDropped()
}

// syncDropped copies the publisher's dropped-message count into the metrics.
func (s *prefixState) syncDropped() {
	d := s.pub.Stats().Dropped
	s.metrics.kvEventsDropped.Add(int64(d - s.dropped))
	s.dropped = d
}

func (s *prefixState) syncGaugeLocked() {
	s.metrics.prefixBlocks.Store(int64(s.cache.Stats().Cached))
}

// eventHash is a block hash as vLLM publishes it (maybe_convert_block_hash): the low 64 bits of the hash read
// big-endian, or the bytes with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0.
func (s *prefixState) eventHash(h blockhash.Hash) kvevents.BlockHash {
	if s.bytesH {
		return kvevents.BytesHash(h[:])
	}
	return kvevents.IntHash(binary.BigEndian.Uint64(h[len(h)-8:]))
}

// KVEventsAddr is the KV-event PUB socket's address, nil without PrefillConfig.KVEvents.
func (p *Prefill) KVEventsAddr() net.Addr {
	if p.prefix == nil || p.prefix.pub == nil {
		return nil
	}
	return p.prefix.pub.Addr()
}

// KVEventsReplayAddr is the replay socket's address, nil without one.
func (p *Prefill) KVEventsReplayAddr() net.Addr {
	if p.prefix == nil || p.prefix.pub == nil {
		return nil
	}
	return p.prefix.pub.ReplayAddr()
}

// HoldTokens is Hold for a prompt given by its token ids, the way to use the prefix cache
// (PrefillConfig.PrefixCache): the request's leading full blocks that are cached under vLLM's block hashes
// of tokens and cacheSalt (vLLM's cache_salt; "" for none) are shared with it, fill writes only the blocks
// after them (from), and the params report the hit as RemotePrefillCachedTokens. Once filled, the prompt's
// full blocks are cached (and published as KV events) for later requests; they stay cached after the
// decode peers have read them, until evicted. Without a prefix cache it is Hold with fill(ctx, blocks, 0).
func (p *Prefill) HoldTokens(ctx context.Context, requestID string, tokens []int64, cacheSalt string, fill PrefixFillFunc) (protocol.KVTransferParams, error) {
	return p.holdRequest(ctx, requestID, len(tokens), tokens, cacheSalt, fill)
}
