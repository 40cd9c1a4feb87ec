package neuron

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gonixl/gonixl/internal/nixltest"
	"github.com/gonixl/gonixl/internal/testenv"
	"github.com/gonixl/gonixl/layout"
	"github.com/gonixl/gonixl/nixl"
)

// testCache is a small NxDI-like cache: host copies of every K/V tensor (the golden source) and the same
// bytes on fake Neuron devices.
type testCache struct {
	spec SourceSpec
	k, v [][]byte
}

// newTestCache fills every tensor with distinct 16-bit values: element i of tensor (l, c) holds
// i + 1 + (2l+c)·stride, so any misplaced element shows.
func newTestCache(spec SourceSpec) *testCache {
	n, err := spec.TensorBytes()
	if err != nil {
		panic(err)
	}
	c := &testCache{spec: spec}
	stride := int(n/2) + 1
	for l := range spec.NumLayers {
		for kv := range 2 {
			b := make([]byte, n)
			for i := range int(n / 2) {
				binary.LittleEndian.PutUint16(b[2*i:], uint16(i+1+(2*l+kv)*stride))
			}
			if kv == 0 {
				c.k = append(c.k, b)
			} else {
				c.v = append(c.v, b)
			}
		}
	}
	return c
}

func (c *testCache) host(tb testing.TB) *HostSource {
	s, err := NewHostSource(c.spec, c.k, c.v)
	require.NoError(tb, err)
	return s
}

// device uploads the cache to tensors on the fake Neuron cores of r.
func (c *testCache) device(tb testing.TB, r *Runtime) *DeviceSource {
	var k, v []*Tensor
	for l := range c.spec.NumLayers {
		for kv, dst := range []*[]*Tensor{&k, &v} {
			src := c.k[l]
			if kv == 1 {
				src = c.v[l]
			}
			t, err := r.Allocate(PlacementDevice, l%2, uint64(len(src)), fmt.Sprintf("kv_mgr.past_key_values.%d", 2*l+kv))
			require.NoError(tb, err)
			require.NoError(tb, t.Write(src, 0))
			*dst = append(*dst, t)
		}
	}
	s, err := NewDeviceSource(c.spec, k, v)
	require.NoError(tb, err)
	return s
}

// expectBlock computes, with a naive loop independent of package layout, the bytes that block slot j of a
// request must hold in the region part of (layer, kv) — the whole block for PlanSplitKV.
func (c *testCache) expectBlock(g layout.Geometry, layer int, kv layout.KV, firstHead int, req Request, j int) []byte {
	out := make([]byte, g.BlockLen())
	sh := c.spec.shape(kv)
	src := c.k[layer]
	if kv == layout.V {
		src = c.v[layer]
	}
	H, D, bs := g.NumKVHeads, g.HeadDim, g.BlockSize
	for t := range bs {
		p := j*bs + t
		for h := range H {
			for d := range D {
				var idx int
				if g.Order == NHDorder() {
					idx = (t*H+h)*D + d
				} else {
					idx = (h*bs+t)*D + d
				}
				var off int
				switch g.Plan {
				case layout.PlanSplitKV:
					off = idx
				case layout.PlanKVHalves:
					off = int(kv)*bs*H*D + idx
				case layout.PlanPackedKV:
					off = (idx/D)*2*D + int(kv)*D + d
				}
				if p >= req.Tokens {
					continue // zero
				}
				sb := req.Row*sh.Heads + firstHead + h
				var si int
				if sh.Transposed {
					si = (sb*D+d)*sh.SeqLen + p
				} else {
					si = (sb*sh.SeqLen+p)*D + d
				}
				copy(out[2*off:2*off+2], src[2*si:2*si+2])
			}
		}
	}
	return out
}

func NHDorder() layout.BlockOrder { return layout.NHD }

// checkArena verifies every block of every request and that all other blocks still hold fill.
func checkArena(t *testing.T, s *Stager, c *testCache, firstHead int, reqs []Request, fill byte) {
	t.Helper()
	g := s.Geometry()
	owned := map[int]bool{}
	for _, req := range reqs {
		for _, b := range req.BlockIDs {
			owned[b] = true
		}
	}
	blen := int(g.BlockLen())
	for layer := range g.NumLayers {
		for _, kv := range []layout.KV{layout.K, layout.V} {
			r, err := g.Region(layer, kv)
			require.NoError(t, err)
			region := s.Region(r)
			for _, req := range reqs {
				for j, b := range req.BlockIDs {
					want := c.expectBlock(g, layer, kv, firstHead, req, j)
					got := region[b*blen : (b+1)*blen]
					if g.Plan != layout.PlanSplitKV { // compare only this kv's bytes: the other kv is checked in its turn
						got, want = kvBytes(g, kv, got), kvBytes(g, kv, want)
					}
					if !bytes.Equal(want, got) {
						t.Fatalf("%v: request %s layer %d %v block slot %d (id %d) holds wrong bytes", g, req.ID, layer, kv, j, b)
					}
				}
			}
			if kv == layout.V || g.Plan == layout.PlanSplitKV {
				for b := range g.NumBlocks {
					if !owned[b] && !bytes.Equal(region[b*blen:(b+1)*blen], bytes.Repeat([]byte{fill}, blen)) {
						t.Fatalf("%v: block %d of region %d belongs to no request but was written", g, b, r)
					}
				}
			}
		}
	}
}

// kvBytes extracts kv's bytes of one block in the shared-region plans.
func kvBytes(g layout.Geometry, kv layout.KV, blk []byte) []byte {
	row := g.RowBytes()
	var out []byte
	switch g.Plan {
	case layout.PlanKVHalves:
		half := len(blk) / 2
		return blk[int(kv)*half : int(kv+1)*half]
	case layout.PlanPackedKV:
		for o := 0; o < len(blk); o += 2 * row {
			out = append(out, blk[o+int(kv)*row:o+int(kv+1)*row]...)
		}
	}
	return out
}

func fillArena(s *Stager, v byte) {
	for r := range s.Geometry().NumRegions() {
		reg := s.Region(r)
		for i := range reg {
			reg[i] = v
		}
	}
}

// smallSpec: 4 layers, 3 source rows, 3 source heads (the rank holds heads 1..2), S' = 20, D = 8, bf16.
func smallSpec(kTransposed bool) SourceSpec {
	return SourceSpec{DType: layout.BF16, Shape: layout.Source{Batch: 3, Heads: 3, SeqLen: 20, HeadDim: 8}, KTransposed: kTransposed, NumLayers: 4}
}

func smallGeometry(order layout.BlockOrder, plan layout.RegionPlan) layout.Geometry {
	return layout.Geometry{NumLayers: 4, NumBlocks: 32, BlockSize: 4, NumKVHeads: 2, HeadDim: 8, DType: layout.BF16, Order: order, Plan: plan}
}

// registerArena registers s's regions with agent as DRAM until the test ends (what the prefill role does).
func registerArena(tb testing.TB, agent *nixl.Agent, s *Stager) {
	registerRegions(tb, agent, s.Geometry(), s.RegionBases())
}

// registerRegions registers the regions of geometry g at bases with agent as DRAM until the test ends.
func registerRegions(tb testing.TB, agent *nixl.Agent, g layout.Geometry, bases []uint64) {
	tb.Helper()
	var descs []nixl.Desc
	for _, base := range bases {
		descs = append(descs, nixl.Desc{Addr: base, Len: uint64(g.RegionLen())})
	}
	reg, err := agent.RegisterMem(nixl.DRAM, descs)
	require.NoError(tb, err)
	tb.Cleanup(func() { require.NoError(tb, reg.Close()) })
}

// peerArena is a decode peer's own DRAM cache of geometry g, registered with agent; it returns the memory
// and the region bases. Both go when the test ends.
func peerArena(tb testing.TB, agent *nixl.Agent, g layout.Geometry) (*nixl.HostMem, []uint64) {
	tb.Helper()
	mem, err := nixl.AllocHost(g.TotalBytes(), nixl.HostOptions{})
	require.NoError(tb, err)
	tb.Cleanup(func() { require.NoError(tb, mem.Close()) })
	bases := make([]uint64, g.NumRegions())
	for r := range bases {
		bases[r] = mem.Addr() + uint64(g.RegionOffset(r))
	}
	registerRegions(tb, agent, g, bases)
	return mem, bases
}

func newStager(tb testing.TB, cfg StagerConfig) *Stager {
	tb.Helper()
	s, err := NewStager(cfg)
	require.NoError(tb, err)
	tb.Cleanup(func() { require.NoError(tb, s.Close()) })
	return s
}

// blockRange returns the block ids first, first+1, ..., first+n-1 (what a caller's pool hands out).
func blockRange(first, n int) []int {
	ids := make([]int, n)
	for i := range ids {
		ids[i] = first + i
	}
	return ids
}

// stageBatch stages three sequences of different lengths with partial last blocks (one with an extra
// block) into disjoint blocks, concurrently, and returns the requests.
func stageBatch(t *testing.T, s *Stager) []Request {
	t.Helper()
	specs := []struct{ row, tokens, blocks int }{{0, 7, 2}, {2, 13, 5}, {1, 20, 5}}
	var reqs []Request
	next := 1
	for i, sp := range specs {
		reqs = append(reqs, Request{ID: fmt.Sprintf("req-%d", i), Row: sp.row, Tokens: sp.tokens, BlockIDs: blockRange(next, sp.blocks)})
		next += sp.blocks
	}
	// Non-contiguous, non-sorted ids: swap the first request's ids.
	reqs[0].BlockIDs[0], reqs[0].BlockIDs[1] = reqs[0].BlockIDs[1], reqs[0].BlockIDs[0]
	var wg sync.WaitGroup
	errs := make([]error, len(reqs))
	for i := range reqs {
		wg.Go(func() { errs[i] = s.Stage(testenv.Context(t, 30*time.Second), reqs[i]) })
	}
	wg.Wait()
	for i, err := range errs {
		require.NoError(t, err, reqs[i].ID)
	}
	return reqs
}

func TestStageExactBytes(t *testing.T) {
	for _, kT := range []bool{false, true} {
		for _, order := range []layout.BlockOrder{layout.NHD, layout.HND} {
			for _, plan := range []layout.RegionPlan{layout.PlanSplitKV, layout.PlanKVHalves, layout.PlanPackedKV} {
				for _, workers := range []int{1, 4} {
					name := fmt.Sprintf("%v/%v/kT=%v/workers=%d", order, plan, kT, workers)
					t.Run(name, func(t *testing.T) {
						rt := openFake(t, LoadOptions{})
						c := newTestCache(smallSpec(kT))
						s := newStager(t, StagerConfig{Geometry: smallGeometry(order, plan), Source: c.device(t, rt), FirstHead: 1, Workers: workers})
						fillArena(s, 0xAA)
						reqs := stageBatch(t, s)
						checkArena(t, s, c, 1, reqs, 0xAA)
						// Per (layer, kv) one native call with one read per head.
						assert.EqualValues(t, 3*2*4*2, ctl(t, rt, "reads"))
					})
				}
			}
		}
	}
}

// Staging from block FromBlock (a cached prefix in the leading blocks) writes the request's later blocks
// exactly as a full Stage does and leaves the leading ones untouched, in every order, plan and source layout
// (transposed K included), for a prefix that ends inside the source row and one that leaves a partial last
// block; FillFrom passes the block through; staging from past the request's blocks is refused.
func TestStageFromBlock(t *testing.T) {
	for _, kT := range []bool{false, true} {
		for _, order := range []layout.BlockOrder{layout.NHD, layout.HND} {
			for _, plan := range []layout.RegionPlan{layout.PlanSplitKV, layout.PlanKVHalves, layout.PlanPackedKV} {
				t.Run(fmt.Sprintf("%v/%v/kT=%v", order, plan, kT), func(t *testing.T) {
					c := newTestCache(smallSpec(kT))
					g := smallGeometry(order, plan)
					s := newStager(t, StagerConfig{Geometry: g, Source: c.host(t), FirstHead: 1, Workers: 2})
					ctx := testenv.Context(t, 30*time.Second)
					for _, tc := range []struct{ row, tokens, from int }{{0, 13, 2}, {2, 20, 4}, {1, 9, 0}, {1, 8, 2}} {
						fillArena(s, 0xAA)
						req := Request{ID: "p", Row: tc.row, Tokens: tc.tokens, BlockIDs: blockRange(3, g.NeededBlocks(tc.tokens))}
						require.NoError(t, s.FillFrom(tc.row, tc.tokens)(ctx, req.BlockIDs, tc.from))
						blen := int(g.BlockLen())
						for layer := range g.NumLayers {
							for _, kv := range []layout.KV{layout.K, layout.V} {
								r, err := g.Region(layer, kv)
								require.NoError(t, err)
								for j, b := range req.BlockIDs {
									got := s.Region(r)[b*blen : (b+1)*blen]
									want := c.expectBlock(g, layer, kv, 1, req, j)
									if j < tc.from {
										want = bytes.Repeat([]byte{0xAA}, blen)
									}
									if g.Plan != layout.PlanSplitKV {
										got, want = kvBytes(g, kv, got), kvBytes(g, kv, want)
									}
									require.Equal(t, want, got, "%+v: layer %d %v block slot %d", tc, layer, kv, j)
								}
							}
						}
					}
					err := s.Stage(ctx, Request{ID: "p", Tokens: 8, BlockIDs: blockRange(3, 2), FromBlock: 3})
					require.ErrorIs(t, err, ErrBadArgument)
				})
			}
		}
	}
}

func TestStageHostSourceMatchesDevice(t *testing.T) {
	rt := openFake(t, LoadOptions{})
	c := newTestCache(smallSpec(false))
	g := smallGeometry(layout.HND, layout.PlanSplitKV)
	sd := newStager(t, StagerConfig{Geometry: g, Source: c.device(t, rt), FirstHead: 1})
	sh := newStager(t, StagerConfig{Geometry: g, Source: c.host(t), FirstHead: 1})
	fillArena(sh, 0xAA)
	fillArena(sd, 0xAA)
	reqs := stageBatch(t, sd)
	for _, r := range reqs {
		require.NoError(t, sh.Stage(testenv.Context(t, 30*time.Second), r))
	}
	for r := range g.NumRegions() {
		require.Equal(t, sd.Region(r), sh.Region(r), "region %d", r)
	}
}

func TestStageValidation(t *testing.T) {
	c := newTestCache(smallSpec(false))
	s := newStager(t, StagerConfig{Geometry: smallGeometry(layout.HND, layout.PlanSplitKV), Source: c.host(t), FirstHead: 1})
	fillArena(s, 0xAA)
	ids := blockRange(1, 3)
	cases := []struct {
		name string
		req  Request
		is   error
	}{
		{"null block", Request{ID: "a", Tokens: 4, BlockIDs: []int{0}}, layout.ErrNullBlock},
		{"out of range", Request{ID: "a", Tokens: 4, BlockIDs: []int{32}}, layout.ErrBlockOutOfRange},
		{"duplicate", Request{ID: "a", Tokens: 8, BlockIDs: []int{ids[0], ids[0]}}, layout.ErrDuplicateBlock},
		{"too few", Request{ID: "a", Tokens: 9, BlockIDs: ids[:2]}, layout.ErrTooFewBlocks},
		{"too many tokens", Request{ID: "a", Tokens: 21, BlockIDs: ids}, ErrBadArgument},
		{"no tokens", Request{ID: "a", Tokens: 0, BlockIDs: ids}, ErrBadArgument},
		{"bad row", Request{ID: "a", Row: 3, Tokens: 4, BlockIDs: ids}, ErrBadArgument},
		{"no id", Request{Tokens: 4, BlockIDs: ids}, ErrBadArgument},
	}
	for _, tc := range cases {
		err := s.Stage(testenv.Context(t, 30*time.Second), tc.req)
		require.ErrorIs(t, err, tc.is, tc.name)
	}
	checkArena(t, s, c, 1, nil, 0xAA) // nothing written
	_, failed := s.Stats()
	assert.EqualValues(t, len(cases), failed)
}

// A failed Stage reports the fault; a retry into the same blocks completes.
func TestStageFaultThenRetry(t *testing.T) {
	for _, workers := range []int{1, 4} {
		t.Run(fmt.Sprint("workers=", workers), func(t *testing.T) {
			rt := openFake(t, LoadOptions{})
			c := newTestCache(smallSpec(false))
			s := newStager(t, StagerConfig{Geometry: smallGeometry(layout.NHD, layout.PlanSplitKV), Source: c.device(t, rt), FirstHead: 1, Workers: workers})
			req := Request{ID: "r", Row: 1, Tokens: 15, BlockIDs: blockRange(1, 4)}
			setCtl(t, rt, "fail_read", ctl(t, rt, "reads")+7) // the 7th read of this Stage times out
			err := s.Stage(testenv.Context(t, 30*time.Second), req)
			require.ErrorIs(t, err, ErrTimeout)
			assert.Contains(t, err.Error(), "NRT_TIMEOUT")
			assert.Contains(t, err.Error(), `"r"`)
			// A retry without the fault completes.
			require.NoError(t, s.Stage(testenv.Context(t, 30*time.Second), req))
			checkArena(t, s, c, 1, []Request{req}, 0)
			staged, failed := s.Stats()
			assert.EqualValues(t, 1, staged)
			assert.EqualValues(t, 1, failed)
		})
	}
}

func TestStageCancelled(t *testing.T) {
	rt := openFake(t, LoadOptions{})
	c := newTestCache(smallSpec(false))
	s := newStager(t, StagerConfig{Geometry: smallGeometry(layout.NHD, layout.PlanSplitKV), Source: c.device(t, rt), FirstHead: 1, Workers: 2})
	// 200 ms per device read: far longer than the deadline plus Go's timer latency while threads sit in C.
	setCtl(t, rt, "read_delay_us", 200000)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
	defer cancel()
	err := s.Stage(ctx, Request{ID: "slow", Tokens: 8, BlockIDs: blockRange(1, 2)})
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Less(t, ctl(t, rt, "reads"), int64(2*4*2), "stopped before reading everything")
}

// TestFillCompleteOnReturn stages through Fill (the connector's FillFunc) with random device latency: the
// moment it returns, every byte of the request is in place.
func TestFillCompleteOnReturn(t *testing.T) {
	rt := openFake(t, LoadOptions{})
	c := newTestCache(smallSpec(false))
	s := newStager(t, StagerConfig{Geometry: smallGeometry(layout.HND, layout.PlanSplitKV), Source: c.device(t, rt), FirstHead: 1, Workers: 3})
	setCtl(t, rt, "read_delay_us", 200)
	for i := range 5 {
		req := Request{Row: i % 3, Tokens: 13 + i%4, BlockIDs: blockRange(1+4*i, 4)}
		require.NoError(t, s.Fill(req.Row, req.Tokens)(testenv.Context(t, 30*time.Second), req.BlockIDs))
		checkArena(t, s, c, 1, []Request{req}, 0)
		fillArena(s, 0)
	}
	err := s.Fill(3, 4)(testenv.Context(t, 30*time.Second), blockRange(1, 1))
	require.ErrorIs(t, err, ErrBadArgument)
	assert.Contains(t, err.Error(), `"row 3"`)
}

func TestStableBasesAcrossRequests(t *testing.T) {
	c := newTestCache(smallSpec(false))
	s := newStager(t, StagerConfig{Geometry: smallGeometry(layout.HND, layout.PlanSplitKV), Source: c.host(t), FirstHead: 1})
	bases := s.RegionBases()
	for i := range 100 {
		tokens := 1 + i%20
		ids := blockRange(1+i%7, (tokens+3)/4+i%2)
		require.NoError(t, s.Stage(testenv.Context(t, 30*time.Second), Request{ID: fmt.Sprint(i), Row: i % 3, Tokens: tokens, BlockIDs: ids}))
	}
	assert.Equal(t, bases, s.RegionBases())
	staged, failed := s.Stats()
	assert.EqualValues(t, 100, staged)
	assert.Zero(t, failed)
}

// TestNIXLReadOfStagedBlocks: a second NIXL agent (the "decode peer") READs the staged blocks into its own
// block ids, exactly as vLLM's NixlConnector does (prepared full descriptor lists + descriptor indices),
// and gets identical bytes.
func TestNIXLReadOfStagedBlocks(t *testing.T) {
	for _, plan := range []layout.RegionPlan{layout.PlanSplitKV, layout.PlanKVHalves} {
		t.Run(plan.String(), func(t *testing.T) {
			rt := openFake(t, LoadOptions{})
			c := newTestCache(smallSpec(true))
			g := smallGeometry(layout.HND, plan)
			prefill, decode := nixltest.Agent(t, "prefill"), nixltest.Agent(t, "decode")
			s := newStager(t, StagerConfig{Geometry: g, Source: c.device(t, rt), FirstHead: 1})
			registerArena(t, prefill, s) // what the connector's prefill role does
			assert.Equal(t, nixl.DRAM, s.MemType())
			assert.Zero(t, s.DeviceID())
			reqs := stageBatch(t, s)

			// The decode peer's own cache of the same geometry.
			dmem, dbases := peerArena(t, decode, g)

			md, err := prefill.LocalMetadata()
			require.NoError(t, err)
			remote, err := decode.LoadRemoteMetadata(md)
			require.NoError(t, err)
			rdescs, err := g.Descs(s.RegionBases(), s.DeviceID())
			require.NoError(t, err)
			ldescs, err := g.Descs(dbases, 0)
			require.NoError(t, err)
			conv := func(ds []layout.Desc) []nixl.Desc {
				out := make([]nixl.Desc, len(ds))
				for i, d := range ds {
					out[i] = nixl.Desc(d)
				}
				return out
			}
			rp, err := decode.Prep(remote, nixl.DRAM, conv(rdescs))
			require.NoError(t, err)
			defer rp.Close()
			lp, err := decode.Prep("", nixl.DRAM, conv(ldescs))
			require.NoError(t, err)
			defer lp.Close()

			for i, req := range reqs {
				// The decoder's blocks: different ids than the prefill side.
				local := make([]int, len(req.BlockIDs))
				for j := range local {
					local[j] = g.NumBlocks - 1 - (i*6 + j)
				}
				ridx, err := g.DescIndices(req.BlockIDs, nil)
				require.NoError(t, err)
				lidx, err := g.DescIndices(local, nil)
				require.NoError(t, err)
				x, err := decode.MakeXfer(nixl.Read, lp, lidx, rp, ridx, nixl.WithNotification([]byte(req.ID+":1")))
				require.NoError(t, err)
				_, err = x.Post()
				require.NoError(t, err)
				require.NoError(t, x.Wait(testenv.Context(t, 30*time.Second)))
				require.NoError(t, x.Close())
				n, err := prefill.WaitNotification(testenv.Context(t, 30*time.Second), func(n nixl.Notification) bool { return string(n.Msg) == req.ID+":1" }, nil)
				require.NoError(t, err)
				assert.Equal(t, decode.Name(), n.Agent)
				blen := int(g.BlockLen())
				for r := range g.NumRegions() {
					dreg := dmem.Bytes()[g.RegionOffset(r) : g.RegionOffset(r)+g.RegionLen()]
					for j, b := range req.BlockIDs {
						require.Equal(t, s.Region(r)[b*blen:(b+1)*blen], dreg[local[j]*blen:(local[j]+1)*blen],
							"request %s region %d block %d", req.ID, r, b)
					}
				}
			}
			require.NoError(t, decode.InvalidateRemoteMetadata(remote))
		})
	}
}

func TestStagerConfigErrors(t *testing.T) {
	c := newTestCache(smallSpec(false))
	src := c.host(t)
	g := smallGeometry(layout.HND, layout.PlanSplitKV)

	big := g
	big.NumBlocks = 1 << 28
	_, err := NewStager(StagerConfig{Geometry: big, Source: src, FirstHead: 1})
	require.ErrorIs(t, err, ErrTooLarge)
	assert.Contains(t, err.Error(), "num-gpu-blocks-override")

	_, err = NewStager(StagerConfig{Geometry: g, Source: src, FirstHead: 1, MaxArenaBytes: g.TotalBytes() - 1})
	require.ErrorIs(t, err, ErrTooLarge)

	_, err = NewStager(StagerConfig{Geometry: g, SchedulerBlocks: 33, Source: src, FirstHead: 1})
	require.ErrorIs(t, err, layout.ErrBlockOutOfRange, "the arena must cover every id the scheduler hands out")

	fromSched := g
	fromSched.NumBlocks = 0
	s, err := NewStager(StagerConfig{Geometry: fromSched, SchedulerBlocks: 9, Source: src, FirstHead: 1})
	require.NoError(t, err)
	assert.Equal(t, 9, s.Geometry().NumBlocks)
	require.NoError(t, s.Close())
	require.NoError(t, s.Close())
	require.ErrorIs(t, s.Stage(testenv.Context(t, 30*time.Second), Request{ID: "x", Tokens: 1, BlockIDs: []int{1}}), ErrClosed)

	_, err = NewStager(StagerConfig{Geometry: g, Source: src, FirstHead: 2})
	require.ErrorIs(t, err, ErrBadArgument, "heads 2..3 of 3")
	wrongDType := g
	wrongDType.DType = layout.FP32
	_, err = NewStager(StagerConfig{Geometry: wrongDType, Source: src, FirstHead: 1})
	require.ErrorIs(t, err, ErrBadArgument)
	_, err = NewStager(StagerConfig{Geometry: g})
	require.ErrorIs(t, err, ErrBadArgument)
}

func TestDeviceSourceFromNxDIState(t *testing.T) {
	rt := openFake(t, LoadOptions{})
	c := newTestCache(smallSpec(false))
	dev := c.device(t, rt)
	state := map[string]*Tensor{}
	for l := range c.spec.NumLayers {
		state[fmt.Sprintf("model.kv_mgr.past_key_values.%d", 2*l)] = dev.k[l]
		state[fmt.Sprintf("kv_mgr.past_key_values.%d", 2*l+1)] = dev.v[l]
	}
	state["kv_mgr.past_key_values.3.scale"] = dev.k[0] // ignored
	state["other"] = dev.k[0]
	src, err := NewDeviceSourceFromState(c.spec, state)
	require.NoError(t, err)
	assert.Equal(t, dev.k, src.k)
	assert.Equal(t, dev.v, src.v)

	delete(state, "kv_mgr.past_key_values.5")
	_, err = NewDeviceSourceFromState(c.spec, state)
	require.ErrorIs(t, err, ErrBadArgument)
	assert.Contains(t, err.Error(), "layer 2")
	state["kv_mgr.past_key_values.5"] = dev.v[2]
	state["kv_mgr.past_key_values.8"] = dev.v[2]
	_, err = NewDeviceSourceFromState(c.spec, state)
	require.ErrorIs(t, err, ErrBadArgument)
}

func TestSourceShapeChecks(t *testing.T) {
	rt := openFake(t, LoadOptions{})
	spec := smallSpec(false)
	n, _ := spec.TensorBytes()
	wrong, err := rt.Allocate(PlacementDevice, 0, uint64(n)+2, "wrong")
	require.NoError(t, err)
	ts := make([]*Tensor, spec.NumLayers)
	for i := range ts {
		ts[i] = wrong
	}
	_, err = NewDeviceSource(spec, ts, ts)
	require.ErrorIs(t, err, ErrBadArgument)
	assert.Contains(t, err.Error(), "needs")
	_, err = NewHostSource(spec, make([][]byte, 4), make([][]byte, 4))
	require.ErrorIs(t, err, ErrBadArgument)
	bad := spec
	bad.Shape.Transposed = true
	_, err = NewHostSource(bad, nil, nil)
	require.ErrorIs(t, err, ErrBadArgument)
}
