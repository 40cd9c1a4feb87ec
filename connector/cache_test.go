package connector

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gonixl/gonixl/connector/protocol"
	"github.com/gonixl/gonixl/layout"
	"github.com/gonixl/gonixl/nixl"
)

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

func (fakeCache) MemType() nixl.MemType { return nixl.DRAM }

func (fakeCache) DeviceID() uint64 { return 0 }

func (fakeCache) RegionBases() []uint64 { return nil }
