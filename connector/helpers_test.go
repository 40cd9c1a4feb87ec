package connector

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/gonixl/gonixl/connector/protocol"
	"github.com/gonixl/gonixl/internal/nixltest"
	"github.com/gonixl/gonixl/layout"
	"github.com/gonixl/gonixl/nixl"
)

// testLib loads the real NIXL (from `make nixl`) once per process, or fails/skips the test.
func testLib(t testing.TB) *nixl.Library {
	t.Helper()
	return nixltest.Lib(t)
}

// Tiny model used by every test: 2 layers, 2 KV heads of 64, bf16, vLLM's block size 16.
const (
	tinyLayers  = 2
	tinyHeads   = 2
	tinyHeadDim = 64
	tinyBlock   = 16
	tinyModel   = "gonixl/test-tiny"
)

// tinyGeom is the tiny model's cache for a profile's layout era.
func tinyGeom(t testing.TB, p protocol.Profile, numBlocks int) layout.Geometry {
	t.Helper()
	g, err := geomFor(p, numBlocks)
	require.NoError(t, err)
	return g
}

func geomFor(p protocol.Profile, numBlocks int) (layout.Geometry, error) {
	plan, err := planFor(p)
	if err != nil {
		return layout.Geometry{}, err
	}
	g := layout.Geometry{NumLayers: tinyLayers, NumBlocks: numBlocks, BlockSize: tinyBlock, NumKVHeads: tinyHeads,
		HeadDim: tinyHeadDim, DType: layout.BF16, Order: layout.HND, Plan: plan}
	return g, g.Validate()
}

// tinyCompat is the compatibility-hash input of the tiny model as the vLLM side of profile p would hash it.
func tinyCompat(p protocol.Profile) Compat {
	return Compat{CompatInputs: protocol.CompatInputs{
		VLLMVersion: p.MinVersion, Model: tinyModel, Dtype: "torch.bfloat16", NumKVHeads: tinyHeads,
		HeadSize: tinyHeadDim, NumHiddenLayers: tinyLayers, AttnBackendName: "FLASH_ATTN", CacheDtype: "auto",
		HMAEnabled: true, // vLLM's default (hybrid KV cache manager on); ignored where not hashed (0.16)
	}}
}

// newCache allocates a DRAM cache closed at the end of the test (after the roles registered on it).
func newCache(t testing.TB, g layout.Geometry) *DRAMCache {
	t.Helper()
	c, err := NewDRAMCache(g, false)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, c.Close()) })
	return c
}

// patternByte is the KV content of byte i of block b in region r for a request seed. The Python peers
// compute the same function (python/vllm_*_peer.py: pattern()).
func patternByte(seed, r, b, i int) byte { return byte(seed + r*131 + b*31 + i*7) }

// blockBytes returns block b of region r of a DRAM cache.
func blockBytes(c *DRAMCache, r, b int) []byte {
	bl := int(c.Geometry().BlockLen())
	return c.Region(r)[b*bl : (b+1)*bl]
}

// fillPattern writes the pattern into the given blocks of every region.
func fillPattern(c *DRAMCache, blocks []int, seed int) {
	for r := 0; r < c.Geometry().NumRegions(); r++ {
		for _, b := range blocks {
			dst := blockBytes(c, r, b)
			for i := range dst {
				dst[i] = patternByte(seed, r, b, i)
			}
		}
	}
}

// patternFill is a FillFunc writing the pattern (what a model's prefill would leave in the blocks).
func patternFill(c *DRAMCache, seed int) FillFunc {
	return func(_ context.Context, blocks []int) error {
		fillPattern(c, blocks, seed)
		return nil
	}
}

// requirePattern checks that local block local[i] holds the pattern of remote block remote[i] in every region.
func requirePattern(t testing.TB, c *DRAMCache, local []int, remote []int64, seed int) {
	t.Helper()
	require.Len(t, local, len(remote))
	for r := 0; r < c.Geometry().NumRegions(); r++ {
		for j, b := range local {
			got := blockBytes(c, r, b)
			for i := range got {
				if want := patternByte(seed, r, int(remote[j]), i); got[i] != want {
					t.Fatalf("region %d, local block %d (remote %d), byte %d: got %#x, want %#x", r, b, remote[j], i, got[i], want)
				}
			}
		}
	}
}

// requireZero checks that the given local blocks were not written.
func requireZero(t testing.TB, c *DRAMCache, local []int) {
	t.Helper()
	for r := 0; r < c.Geometry().NumRegions(); r++ {
		for _, b := range local {
			for i, v := range blockBytes(c, r, b) {
				if v != 0 {
					t.Fatalf("region %d, block %d, byte %d was written (%#x) although the pull was refused", r, b, i, v)
				}
			}
		}
	}
}

// observed returns a logger recording every entry at debug level and above.
func observed() (*zap.Logger, *observer.ObservedLogs) {
	core, logs := observer.New(zapcore.DebugLevel)
	return zap.New(core), logs
}

// fieldsOf returns an entry's context as a map.
func fieldsOf(e observer.LoggedEntry) map[string]any { return e.ContextMap() }

// pairOpts tunes newPair.
type pairOpts struct {
	prefillBlocks, decodeBlocks int
	hold                        time.Duration
	prefillLog, decodeLog       *zap.Logger
	decodeCompat                *Compat
	decodeProfile               *protocol.Profile
	backends                    []nixl.BackendSpec
	clock                       *fakeClock                           // the prefill role's clock of holds and leases; nil = time.Now
	decodeDevice                string                               // DecodeConfig.DataDevice
	notifyFrom                  func(decodeEngineID string) []string // PrefillConfig.NotifyFrom
	prefixCache                 *PrefixCacheConfig                   // PrefillConfig.PrefixCache
	kvEvents                    *KVEventsConfig                      // PrefillConfig.KVEvents
	readAgents                  int                                  // DecodeConfig.ReadAgents
	idlePoll                    time.Duration                        // PrefillConfig.idlePoll
	busyPoll                    time.Duration                        // PrefillConfig.BusyPoll
}

// fakeClock is a clock that moves only when the test says so: hold and lease tests assert what happens
// before and after an expiry without depending on how fast a loaded machine runs.
type fakeClock struct{ ns atomic.Int64 }

func newFakeClock() *fakeClock {
	c := &fakeClock{}
	c.ns.Store(time.Now().UnixNano())
	return c
}

func (c *fakeClock) Now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *fakeClock) Advance(d time.Duration) { c.ns.Add(int64(d)) }

// advanceAndSettle moves the prefill role's fake clock by d (at least 50 ms, the loop's expiry period) and
// waits until the role's loop has run an expiry pass at the new time.
func advanceAndSettle(t testing.TB, pre *Prefill, c *fakeClock, d time.Duration) {
	t.Helper()
	require.GreaterOrEqual(t, d, expiryPeriod, "the loop runs an expiry pass once the clock moved expiryPeriod")
	n := pre.passes.Load()
	c.Advance(d)
	require.Eventually(t, func() bool { return pre.passes.Load() > n }, 30*time.Second, time.Millisecond, "no expiry pass")
}

type pair struct {
	p          protocol.Profile
	pre        *Prefill
	dec        *Decode
	pcache     *DRAMCache
	dcache     *DRAMCache
	preM, decM *Metrics
}

// newPair starts a Go prefill role and a Go decode role of profile p in this process, each on its own DRAM
// cache and NIXL agent (UCX unless told otherwise). Both are closed at the end of the test.
func newPair(t testing.TB, p protocol.Profile, o pairOpts) *pair {
	t.Helper()
	l := testLib(t)
	if o.prefillBlocks == 0 {
		o.prefillBlocks = 32
	}
	if o.decodeBlocks == 0 {
		o.decodeBlocks = 24
	}
	pr := &pair{p: p, preM: &Metrics{}, decM: &Metrics{}}
	pr.pcache = newCache(t, tinyGeom(t, p, o.prefillBlocks))
	dp := p
	if o.decodeProfile != nil {
		dp = *o.decodeProfile
	}
	pr.dcache = newCache(t, tinyGeom(t, dp, o.decodeBlocks))
	var err error
	var clock func() time.Time
	if o.clock != nil {
		clock = o.clock.Now
	}
	decID := fmt.Sprintf("decode-%s-%d", p.Name, time.Now().UnixNano())
	var notifyFrom []string
	if o.notifyFrom != nil {
		notifyFrom = o.notifyFrom(decID)
	}
	pr.pre, err = NewPrefill(PrefillConfig{RoleConfig: RoleConfig{Profile: p, Library: l, Cache: pr.pcache, Compat: tinyCompat(p), Logger: o.prefillLog, Metrics: pr.preM, Backends: o.backends, EngineID: fmt.Sprintf("prefill-%s-%d", p.Name, time.Now().UnixNano())}, clock: clock, idlePoll: o.idlePoll, BusyPoll: o.busyPoll, NotifyFrom: notifyFrom, HoldTimeout: o.hold, PrefixCache: o.prefixCache, KVEvents: o.kvEvents})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, pr.pre.Close()) })
	dc := tinyCompat(dp)
	if o.decodeCompat != nil {
		dc = *o.decodeCompat
	}
	pr.dec, err = NewDecode(DecodeConfig{RoleConfig: RoleConfig{Profile: dp, Library: l, Cache: pr.dcache, Compat: dc, Logger: o.decodeLog, EngineID: decID, DataDevice: o.decodeDevice, Metrics: pr.decM, Backends: o.backends}, HandshakeTimeout: 2 * time.Second, HandshakeAttempts: 2, ReadAgents: o.readAgents})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, pr.dec.Close()) })
	return pr
}

// prefill has the pair's prefill role prefill request id (tokens tokens, the pattern of seed) and returns its
// kv_transfer_params.
func (pr *pair) prefill(t testing.TB, ctx context.Context, id string, tokens, seed int) protocol.KVTransferParams {
	t.Helper()
	kv, err := pr.pre.Hold(ctx, id, tokens, patternFill(pr.pcache, seed))
	require.NoError(t, err)
	return kv
}

// localBlocks returns n decode-side block ids (1..n, shifted by off) for a pull.
func localBlocks(n, off int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = 1 + off + i
	}
	return out
}

// LocalBlocks is localBlocks for the external tests (package connector_test); like every name in a _test.go
// file it exists only in test builds.
var LocalBlocks = localBlocks
