package connector

import (
	"bytes"
	"fmt"
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

// The probe agent that checks a peer's metadata (probeLoad) runs without NIXL's UCX thread pool, whose workers
// would each connect an endpoint to the peer, and only once maxUnprobedFailures blobs failed to load: until
// then a handshake loads the blob straight into the role's agents, under an alias, and a blob NIXL fails to
// load costs nothing later (the real engine, whose blob claims the same name, still loads); from then on every
// new blob is probed first, and the failures counted stay at the bound.
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
	ctx := testenv.Context(t, 60*time.Second)
	probes := func() (bool, int, int) {
		pr.dec.agentsMu.Lock()
		defer pr.dec.agentsMu.Unlock()
		return pr.dec.probe != nil, pr.dec.probeSeq, pr.dec.loadFailures
	}
	kv := pr.prefill(t, ctx, "victim", 2*tinyBlock, 1)
	cut := func(md *protocol.AgentMetadata) { md.AgentMetadata = md.AgentMetadata[:len(md.AgentMetadata)-16] }
	for i := range maxUnprobedFailures + 2 {
		bad := hostileEngine(t, pr, fmt.Sprintf("cut-%d", i), kv, cut)
		_, err := pr.dec.Pull(ctx, fmt.Sprintf("hostile-%d", i), bad, localBlocks(2, 10))
		require.Error(t, err, "a pull through a blob cut in its memory sections")
		_, seq, failures := probes()
		if i < maxUnprobedFailures {
			require.Zero(t, seq, "no probe before %d failures (pull %d)", maxUnprobedFailures, i)
			require.Equal(t, i+1, failures)
		} else {
			require.Equal(t, i+1-maxUnprobedFailures, seq, "the probe loads the blob and is replaced after it failed (pull %d)", i)
			require.Equal(t, maxUnprobedFailures, failures, "failures in the probe cost the role's agents nothing")
		}
	}
	_, err = pr.dec.Pull(ctx, "victim", kv, localBlocks(2, 0))
	require.NoError(t, err, "the real engine, whose blob claims the name the cut ones did, loads")
	requirePattern(t, pr.dcache, localBlocks(2, 0), kv.RemoteBlockIDs[0], 1)
	live, seq, _ := probes()
	require.True(t, live, "the real blob went through a probe, which it left as it was")
	require.Equal(t, 3, seq)
}

// A handshake that meets no bad blob loads it straight into the role's agents: no probe agent is created.
func TestNoProbeWithoutFailures(t *testing.T) {
	p, err := protocol.ProfileByName("0.33")
	require.NoError(t, err)
	pr := newPair(t, p, pairOpts{})
	ctx := testenv.Context(t, 10*time.Second)
	kv, err := pr.pre.Hold(ctx, "p1", tinyBlock, patternFill(pr.pcache, 3))
	require.NoError(t, err)
	_, err = pr.dec.Pull(ctx, "p1", kv, []int{5})
	require.NoError(t, err)
	pr.dec.agentsMu.Lock()
	defer pr.dec.agentsMu.Unlock()
	require.Nil(t, pr.dec.probe)
	require.Zero(t, pr.dec.probeSeq)
	require.Len(t, pr.dec.agents, 1)
	for name, la := range pr.dec.agents {
		require.Equal(t, name+"#1", la.alias, "loaded under an alias of its own")
	}
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

// NewDecode warms up the UCX worker of its agent and of each read agent by loading another of them (their
// protocol selection for a same-host peer is then done before any handshake) and forgets those loads: no
// agent keeps another's metadata, and a pull works as before.
func TestWorkersWarmedUp(t *testing.T) {
	p, err := protocol.ProfileByName("0.33")
	require.NoError(t, err)
	pr := newPair(t, p, pairOpts{})
	ras := pr.dec.reg.readAgents
	if len(ras) == 0 {
		require.Zero(t, pr.dec.warmed, "no read agents, nothing warmed")
		t.Skip("no read agents on a 1-CPU host")
	}
	require.Equal(t, 1+len(ras), pr.dec.warmed)
	role := pr.dec.reg.agent
	require.ErrorIs(t, role.CheckRemoteMetadata(ras[0].agent.Name(), nixl.DRAM, nil), nixl.ErrNotFound)
	for _, ra := range ras {
		require.ErrorIs(t, ra.agent.CheckRemoteMetadata(role.Name(), nixl.DRAM, nil), nixl.ErrNotFound)
	}
	ctx := testenv.Context(t, 10*time.Second)
	kv, err := pr.pre.Hold(ctx, "p1", tinyBlock, patternFill(pr.pcache, 3))
	require.NoError(t, err)
	_, err = pr.dec.Pull(ctx, "p1", kv, []int{5})
	require.NoError(t, err)
}
