package connector

import (
	"bytes"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gonixl/gonixl/connector/protocol"
	"github.com/gonixl/gonixl/internal/testenv"
	"github.com/gonixl/gonixl/nixl"
)

// The handshake READs the prefill side's null block into the local one (the warm-up that sets the data
// path up before the first request's READ), in every profile's layout, and touches no other local block;
// where the profile has leases it also sends the request's heartbeat (warmUpNotification), and none where
// it has not.
func TestHandshakeWarmsUp(t *testing.T) {
	for _, name := range []string{"0.16", "0.33"} {
		t.Run(name, func(t *testing.T) {
			p, _ := protocol.ProfileByName(name)
			pr := newPair(t, p, pairOpts{})
			g := pr.pcache.Geometry()
			for r := 0; r < g.NumRegions(); r++ {
				region := pr.pcache.Region(r)
				for i := range g.BlockLen() {
					region[i] = byte(0xa5 ^ r ^ int(i)) // block 0 of every region
				}
			}
			ctx := testenv.Context(t, 10*time.Second)
			kv, err := pr.pre.Hold(ctx, "w1", tinyBlock, patternFill(pr.pcache, 3))
			require.NoError(t, err)
			_, err = pr.dec.Pull(ctx, "w1", kv, []int{5})
			require.NoError(t, err)
			dg := pr.dcache.Geometry()
			for r := 0; r < dg.NumRegions(); r++ {
				require.True(t, bytes.Equal(pr.pcache.Region(r)[:g.BlockLen()], pr.dcache.Region(r)[:dg.BlockLen()]),
					"region %d: the local null block holds the prefill's", r)
				require.True(t, bytes.Equal(make([]byte, dg.BlockLen()), pr.dcache.Region(r)[dg.BlockLen():2*dg.BlockLen()]),
					"region %d: block 1 untouched", r)
			}
			requirePattern(t, pr.dcache, []int{5}, kv.RemoteBlockIDs[0], 3)
			if p.Leases {
				require.Eventually(t, func() bool { return pr.preM.Heartbeats() >= 1 }, 10*time.Second, time.Millisecond,
					"the handshake's heartbeat reached the prefill side")
				require.GreaterOrEqual(t, pr.decM.Heartbeats(), int64(1))
			} else {
				require.Zero(t, pr.decM.Heartbeats(), "no leases: no heartbeat")
			}
			require.Zero(t, pr.preM.BadMessages())
			require.Zero(t, pr.preM.ForgedNotifications())
		})
	}
}

// The warm-up READ has enough descriptors for NIXL's UCX thread pool to give each of its threads a share.
func TestWarmUpDescs(t *testing.T) {
	ucx := func(params map[string]string) []nixl.BackendSpec {
		return []nixl.BackendSpec{{Plugin: "UCX", Params: params}}
	}
	for _, c := range []struct {
		name  string
		specs []nixl.BackendSpec
		want  int
	}{
		{"none", nil, 1},
		{"no pool", ucx(map[string]string{}), 1},
		{"gonixl's pool", ucx(map[string]string{"num_threads": "16", "split_batch_size": "4"}), 64},
		{"NIXL's split", ucx(map[string]string{"num_threads": "4"}), maxWarmUpDescs},
		{"another plugin", []nixl.BackendSpec{{Plugin: "LIBFABRIC", Params: map[string]string{"num_threads": "8"}}}, 1},
	} {
		require.Equal(t, c.want, warmUpDescs(c.specs), c.name)
	}
}

// The probe agent that checks a peer's metadata (probeLoad) is created when the role starts, not in the first
// handshake, and without NIXL's UCX thread pool, whose workers would each connect an endpoint to the peer.
func TestProbeAgent(t *testing.T) {
	specs := []nixl.BackendSpec{
		{Plugin: "UCX", Params: map[string]string{"num_threads": "4", "split_batch_size": "4", "engine_config": "RMA_PPLN_ENABLE=y"}},
		{Plugin: "LIBFABRIC", Params: map[string]string{"num_threads": "8"}},
	}
	got := withoutThreadPool(specs)
	require.Equal(t, []nixl.BackendSpec{
		{Plugin: "UCX", Params: map[string]string{"engine_config": "RMA_PPLN_ENABLE=y"}},
		{Plugin: "LIBFABRIC", Params: map[string]string{"num_threads": "8"}},
	}, got)
	require.Equal(t, "4", specs[0].Params["num_threads"], "the role's own specs are left as they were")

	p, err := protocol.ProfileByName("0.33")
	require.NoError(t, err)
	pr := newPair(t, p, pairOpts{})
	select {
	case <-pr.dec.probeInit:
	case <-time.After(10 * time.Second):
		require.FailNow(t, "the probe agent was not created in the background")
	}
	require.NotNil(t, pr.dec.probe, "created before any handshake")
	probe := pr.dec.probe
	ctx := testenv.Context(t, 10*time.Second)
	kv, err := pr.pre.Hold(ctx, "p1", tinyBlock, patternFill(pr.pcache, 3))
	require.NoError(t, err)
	_, err = pr.dec.Pull(ctx, "p1", kv, []int{5})
	require.NoError(t, err)
	require.Same(t, probe, pr.dec.probe, "the handshake used the probe created at start")
}

// A decode role reading into GPU memory or DRAM runs UCX without NIXL's thread pool when its UCX spec has
// gonixl's default parameters (its READs then keep NIXL's merged runs); every other role, cache and spec is
// kept as given.
func TestRoleBackends(t *testing.T) {
	parsed := ParseBackends([]string{"UCX", "LIBFABRIC"})
	require.True(t, threadPool(DefaultBackends), "DefaultBackends has a pool")
	for _, specs := range [][]nixl.BackendSpec{DefaultBackends, parsed} {
		for _, mem := range []nixl.MemType{nixl.VRAM, nixl.DRAM} {
			got, sized := roleBackends(roleDecode, mem, specs)
			require.True(t, sized)
			require.False(t, threadPool(got))
			require.Equal(t, specs[0].Params["engine_config"], got[0].Params["engine_config"])
			require.Equal(t, specs[1:], got[1:])
			require.True(t, threadPool(specs), "the input is left as it was")
			require.Equal(t, 1, warmUpDescs(got), "one warm-up descriptor without a pool")
		}

		for _, mem := range []nixl.MemType{nixl.VRAM, nixl.DRAM} {
			got, sized := roleBackends(rolePrefill, mem, specs)
			require.False(t, sized)
			require.Equal(t, specs, got)
		}
	}
	custom, err := nixl.UCXOptions{NumThreads: 8, SplitBatchSize: 2}.Spec()
	require.NoError(t, err)
	for _, mem := range []nixl.MemType{nixl.VRAM, nixl.DRAM} {
		got, sized := roleBackends(roleDecode, mem, []nixl.BackendSpec{custom})
		require.False(t, sized, "explicit options are kept")
		require.Equal(t, []nixl.BackendSpec{custom}, got, "explicit options are kept")
	}
}

// A DRAM decode role with gonixl's default UCX keeps NIXL's merged runs (no WithoutDescMerge) and runs no
// pool; with an explicit pool it posts one descriptor per block, as before. Both READ the same bytes.
func TestDRAMDecodeMergedRuns(t *testing.T) {
	p, err := protocol.ProfileByName("0.33")
	require.NoError(t, err)
	explicit, err := nixl.UCXOptions{NumThreads: 4, SplitBatchSize: 4}.Spec()
	require.NoError(t, err)
	for _, c := range []struct {
		name     string
		backends []nixl.BackendSpec
		split    bool
	}{
		{"default", nil, false},
		{"explicit pool", []nixl.BackendSpec{explicit}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			pr := newPair(t, p, pairOpts{backends: c.backends})
			require.Equal(t, c.split && testLib(t).HasSkipDescMerge(), pr.dec.reg.splitDescs)
			require.Equal(t, c.split, threadPool(pr.dec.reg.backends))
			ctx := testenv.Context(t, 10*time.Second)
			kv, err := pr.pre.Hold(ctx, "m1", 4*tinyBlock, patternFill(pr.pcache, 7))
			require.NoError(t, err)
			local := []int{3, 4, 5, 6}
			_, err = pr.dec.Pull(ctx, "m1", kv, local)
			require.NoError(t, err)
			requirePattern(t, pr.dcache, local, kv.RemoteBlockIDs[0], 7)
		})
	}
}
