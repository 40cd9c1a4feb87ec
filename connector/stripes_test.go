package connector

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gonixl/gonixl/internal/testenv"
	"github.com/gonixl/gonixl/nixl"
)

func TestSplit(t *testing.T) {
	for _, c := range []struct {
		n, k int
		want [][2]int
	}{
		{1, 4, [][2]int{{0, 1}}},
		{7, 2, [][2]int{{0, 3}, {3, 7}}},
		{8, 4, [][2]int{{0, 2}, {2, 4}, {4, 6}, {6, 8}}},
		{5, 3, [][2]int{{0, 1}, {1, 3}, {3, 5}}},
	} {
		assert.Equal(t, c.want, split(c.n, c.k), "split(%d, %d)", c.n, c.k)
	}
}

func TestDefaultReadAgents(t *testing.T) {
	want := defaultReadAgentCount
	if runtime.NumCPU() < 2 {
		want = 0
	}
	assert.Equal(t, want, defaultReadAgents(nixl.DRAM, true), "a DRAM cache with gonixl's UCX")
	assert.Zero(t, defaultReadAgents(nixl.VRAM, true), "a GPU cache")
	assert.Zero(t, defaultReadAgents(nixl.DRAM, false), "explicit backends")
}

// A decode role's READs split over its read agents (DecodeConfig.ReadAgents) land every block where it
// belongs, for counts that divide the request's descriptors unevenly, and the one notification after them
// frees the prefill's blocks; ReadAgents 1 reads through the role's agent alone.
func TestReadAgents(t *testing.T) {
	p := roleProfiles()[len(roleProfiles())-1]
	for _, n := range []int{1, 2, 3} {
		t.Run(fmt.Sprintf("read_agents=%d", n), func(t *testing.T) {
			pr := newPair(t, p, pairOpts{readAgents: n})
			if n == 1 {
				require.Empty(t, pr.dec.reg.readAgents)
			} else {
				require.Len(t, pr.dec.reg.readAgents, n)
			}
			ctx := testenv.Context(t, 20*time.Second)
			for i, tokens := range []int{1, 17, 40, 75} {
				id := fmt.Sprintf("req-%d", i)
				kv := pr.prefill(t, ctx, id, tokens, i+1)
				blocks := (tokens + tinyBlock - 1) / tinyBlock
				local := localBlocks(blocks, 3)
				res, err := pr.dec.Pull(ctx, "dec-"+id, kv, local)
				require.NoError(t, err)
				requirePattern(t, pr.dcache, local, kv.RemoteBlockIDs[0], i+1)
				g := pr.dcache.Geometry()
				assert.Equal(t, int64(blocks)*g.BlockLen()*int64(g.NumRegions()), res.Bytes)
				require.Eventually(t, func() bool { return pr.pre.Held() == 0 }, 30*time.Second, 5*time.Millisecond, "the notification after the stripes frees the blocks")
			}
			assert.EqualValues(t, 4, pr.preM.Notifications(), "one notification per pull, whatever the stripes")
			assert.Zero(t, pr.decM.RequestErrors())
		})
	}
}

func TestReadAgentsRefused(t *testing.T) {
	_, err := NewDecode(DecodeConfig{ReadAgents: -1})
	require.ErrorContains(t, err, "ReadAgents is -1")
}
