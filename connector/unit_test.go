package connector

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gonixl/gonixl/connector/protocol"
	"github.com/gonixl/gonixl/layout"
	"github.com/gonixl/gonixl/nixl"
)

func TestBlockPool(t *testing.T) {
	p := NewBlockPool(8) // ids 1..7; 0 is the null block
	assert.Equal(t, 7, p.Available())
	assert.Zero(t, p.InUse())

	a, err := p.Alloc(3)
	require.NoError(t, err)
	assert.Equal(t, []int{1, 2, 3}, a, "lowest ids first")
	b, err := p.Alloc(4)
	require.NoError(t, err)
	assert.Equal(t, 7, p.InUse())
	assert.Zero(t, p.Available())
	for _, id := range append(a, b...) {
		assert.NotZero(t, id, "block 0 is never handed out")
	}

	_, err = p.Alloc(1)
	require.ErrorIs(t, err, ErrNoBlocks)
	assert.Contains(t, err.Error(), "want 1, 0 of 7 free")
	_, err = p.Alloc(-1)
	require.ErrorIs(t, err, ErrNoBlocks)
	none, err := p.Alloc(0)
	require.NoError(t, err)
	assert.Empty(t, none)

	p.Free(a)
	p.Free(a)                // a double free is ignored
	p.Free([]int{0, 99, -1}) // ids never handed out are ignored
	assert.Equal(t, 3, p.Available())
	assert.Equal(t, 4, p.InUse())
	c, err := p.Alloc(3)
	require.NoError(t, err)
	assert.ElementsMatch(t, a, c)
	_, err = p.Alloc(1)
	require.ErrorIs(t, err, ErrNoBlocks, "the double free did not make a block available twice")

	assert.Zero(t, NewBlockPool(1).Available(), "a cache with only the null block has nothing to hand out")

	// Freed blocks come back in ascending order, lowest first, whatever order they were freed in: a request's
	// blocks stay one ascending run (one NIXL descriptor per region) where the pool has one.
	q := NewBlockPool(16)
	x, _ := q.Alloc(4) // 1..4
	y, _ := q.Alloc(3) // 5..7
	q.Free([]int{x[3], x[1], x[0], x[2]})
	z, err := q.Alloc(6)
	require.NoError(t, err)
	assert.Equal(t, []int{1, 2, 3, 4, 8, 9}, z)
	q.Free(y)
	q.Free(z[:2])
	w, err := q.Alloc(5)
	require.NoError(t, err)
	assert.Equal(t, []int{1, 2, 5, 6, 7}, w)
	assert.Zero(t, NewBlockPool(0).Available())
}

func TestBlockPoolConcurrent(t *testing.T) {
	p := NewBlockPool(65)
	var wg sync.WaitGroup
	var mu sync.Mutex
	owner := map[int]int{}
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 200; i++ {
				ids, err := p.Alloc(1 + i%8)
				if err != nil {
					continue
				}
				mu.Lock()
				for _, id := range ids {
					if o, ok := owner[id]; ok {
						t.Errorf("block %d handed to goroutine %d while goroutine %d holds it", id, g, o)
					}
					owner[id] = g
				}
				mu.Unlock()
				mu.Lock()
				for _, id := range ids {
					delete(owner, id)
				}
				mu.Unlock()
				p.Free(ids)
			}
		}()
	}
	wg.Wait()
	assert.Equal(t, 64, p.Available())
	assert.Zero(t, p.InUse())
}

func TestParseBackends(t *testing.T) {
	assert.Equal(t, []nixl.BackendSpec{{Plugin: "LIBFABRIC"}}, ParseBackends([]string{"LIBFABRIC"}))
	ucx, err := nixl.DefaultUCXOptions().Spec()
	require.NoError(t, err)
	assert.Equal(t, []nixl.BackendSpec{ucx, {Plugin: "LIBFABRIC"}}, ParseBackends([]string{" ucx ", "", "libfabric"}))
	assert.Empty(t, ParseBackends(nil))
	assert.Empty(t, ParseBackends([]string{" ", ""}))
	assert.Equal(t, []nixl.BackendSpec{ucx}, DefaultBackends)
	assert.Contains(t, ucx.Params["engine_config"], "RMA_PPLN_ENABLE=y", "RMA pipeline on by default")
}

func TestPlanFor(t *testing.T) {
	want := map[protocol.LayoutEra]layout.RegionPlan{protocol.LayoutA: layout.PlanSplitKV,
		protocol.LayoutB: layout.PlanKVHalves, protocol.LayoutC: layout.PlanPackedKV}
	for _, p := range protocol.Profiles {
		plan, err := planFor(p)
		require.NoError(t, err, p.Name)
		assert.Equal(t, want[p.Layout], plan, p.Name)
	}
	plan, err := planFor(protocol.Profile{Name: "era-b", Layout: protocol.LayoutB})
	require.NoError(t, err)
	assert.Equal(t, layout.PlanKVHalves, plan)
	_, err = planFor(protocol.Profile{Name: "future"})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "future")

	// The roles refuse a cache whose plan is not the profile's era.
	p16, _ := protocol.ProfileByName("0.16")
	g, err := geomFor(p16, 4)
	require.NoError(t, err)
	g.Plan = layout.PlanPackedKV
	err = checkPlan(p16, fakeCache{g})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "packed-kv")
	require.Error(t, checkPlan(p16, nil))
}

type fakeCache struct{ g layout.Geometry }

func (c fakeCache) Geometry() layout.Geometry { return c.g }
func (fakeCache) MemType() nixl.MemType       { return nixl.DRAM }
func (fakeCache) DeviceID() uint64            { return 0 }
func (fakeCache) RegionBases() []uint64       { return nil }

// A heartbeat extends a lease by 2/3 of it, as vLLM does (30 s lease → 20 s), also for the default lease, whose
// nanosecond product overflows int64.
func TestLeaseExtension(t *testing.T) {
	p33, _ := protocol.ProfileByName("0.33")
	p16, _ := protocol.ProfileByName("0.16")
	for _, c := range []struct {
		p    protocol.Profile
		hold time.Duration
		want time.Duration
	}{
		{p33, p33.LeaseDuration, 20 * time.Second},
		{p33, 3 * time.Second, 2 * time.Second},
		{p33, 10 * time.Minute, 400 * time.Second},
		{p16, time.Second, time.Second},
	} {
		pr := &Prefill{cfg: PrefillConfig{Profile: c.p}, hold: c.hold}
		assert.InDelta(t, float64(c.want), float64(pr.leaseExtension()), float64(time.Microsecond), "%s hold %v", c.p.Name, c.hold)
	}
}

// A role without a profile is refused before anything is registered, with the config field to set.
func TestRolesNeedAProfile(t *testing.T) {
	_, err := NewPrefill(PrefillConfig{})
	require.ErrorContains(t, err, "connector: PrefillConfig.Profile is not set")
	_, err = NewDecode(DecodeConfig{})
	require.ErrorContains(t, err, "connector: DecodeConfig.Profile is not set")
}

// A negative HoldTimeout would free every request's blocks at the first expiry pass, before a decode peer could
// read them: NewPrefill refuses it before it creates a cache or touches NIXL (no Library here), naming the field.
func TestPrefillRefusesNegativeHoldTimeout(t *testing.T) {
	qwen := Model{Name: "Qwen/Qwen3-0.6B", Layers: 28, KVHeads: 8, HeadDim: 128, DType: layout.BF16}
	for _, hold := range []time.Duration{-1, -time.Second} {
		_, err := NewPrefill(PrefillConfig{VLLMVersion: "0.16.0", Model: qwen, NumBlocks: 16, HoldTimeout: hold})
		require.ErrorContains(t, err, "connector: PrefillConfig.HoldTimeout is "+hold.String()+": set a positive duration")
	}
	// The same config with the default hold gets past the check (and fails only for want of a NIXL library).
	_, err := NewPrefill(PrefillConfig{VLLMVersion: "0.16.0", Model: qwen, NumBlocks: 16})
	require.ErrorContains(t, err, "nil NIXL library")
	// A notification key too short to be secret, and ranks in separate processes without a shared key (each
	// would draw its own, and drop the others' notifications as forged), are refused naming the field.
	_, err = NewPrefill(PrefillConfig{VLLMVersion: "0.16.0", Model: qwen, NumBlocks: 16, NotifyKey: []byte("short")})
	require.ErrorContains(t, err, "connector: PrefillConfig.NotifyKey has 5 bytes: give at least 16")
	_, err = NewPrefill(PrefillConfig{VLLMVersion: "0.16.0", Model: qwen, NumBlocks: 16, TPSize: 2})
	require.ErrorContains(t, err, "connector: PrefillConfig.TPSize is 2 with no shared SideChannel: set NotifyKey")
	_, err = NewPrefill(PrefillConfig{VLLMVersion: "0.16.0", Model: qwen, NumBlocks: 16, TPSize: 2, NotifyKey: make([]byte, 16)})
	require.ErrorContains(t, err, "nil NIXL library")
	// Likewise a decode role's HandshakeTimeout: a negative one would fail every handshake at once.
	_, err = NewDecode(DecodeConfig{VLLMVersion: "0.16.0", Model: qwen, NumBlocks: 16, HandshakeTimeout: -time.Second})
	require.ErrorContains(t, err, "connector: DecodeConfig.HandshakeTimeout is -1s: set a positive duration")
	_, err = NewDecode(DecodeConfig{VLLMVersion: "0.16.0", Model: qwen, NumBlocks: 16})
	require.ErrorContains(t, err, "nil NIXL library")
}
