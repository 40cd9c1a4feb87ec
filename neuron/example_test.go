package neuron_test

import (
	"context"
	"fmt"
	"os"

	"github.com/gonixl/gonixl/connector"
	"github.com/gonixl/gonixl/layout"
	"github.com/gonixl/gonixl/neuron"
	"github.com/gonixl/gonixl/neuron/neurontest"
)

// A Stager is a connector.Cache and its Fill a connector.FillFunc, structurally: package neuron does not import
// the connector.
var (
	_ connector.Cache    = (*neuron.Stager)(nil)
	_ connector.FillFunc = (*neuron.Stager)(nil).Fill(0, 1)
)

// Staging a prefill request from (fake) Neuron device tensors into the host arena a decode peer reads.
// With a real Trainium the only change is LoadOptions.Path (or nothing: libnrt.so.1 is found by itself). In a
// server the Stager is the prefill role's Cache (the role registers it with NIXL, allocates the blocks and
// holds them for the decode peer) and Fill is what it runs: role.Hold(ctx, id, 20, st.Fill(row, 20)).
func Example() {
	dir, _ := os.MkdirTemp("", "fakenrt")
	defer os.RemoveAll(dir)
	lib, err := neurontest.Build(dir) // no Trainium here: the fake libnrt, same dlopen path
	if err != nil {
		fmt.Println(err)
		return
	}
	rt, err := neuron.Load(neuron.LoadOptions{Path: lib})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer rt.Close()

	// NxDI's per-layer K and V tensors: (batch 1, 2 KV heads, 32 positions, head_dim 4), bf16, 2 layers.
	spec := neuron.SourceSpec{DType: layout.BF16, Shape: layout.Source{Batch: 1, Heads: 2, SeqLen: 32, HeadDim: 4}, NumLayers: 2}
	size, _ := spec.TensorBytes()
	var k, v []*neuron.Tensor
	for l := range 2 {
		kt, _ := rt.Allocate(neuron.PlacementDevice, 0, uint64(size), fmt.Sprintf("kv_mgr.past_key_values.%d", 2*l))
		vt, _ := rt.Allocate(neuron.PlacementDevice, 0, uint64(size), fmt.Sprintf("kv_mgr.past_key_values.%d", 2*l+1))
		k, v = append(k, kt), append(v, vt)
	}
	src, err := neuron.NewDeviceSource(spec, k, v)
	if err != nil {
		fmt.Println(err)
		return
	}

	// The layout the decode peer expects; the arena is sized from the scheduler's pool (9 blocks).
	g := layout.Geometry{NumLayers: 2, BlockSize: 16, NumKVHeads: 2, HeadDim: 4, DType: layout.BF16, Order: layout.HND, Plan: layout.PlanSplitKV}
	st, err := neuron.NewStager(neuron.StagerConfig{Geometry: g, SchedulerBlocks: 9, Source: src, Lock: neuron.LockBestEffort})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer st.Close()

	ids := []int{1, 2} // 20 tokens at block size 16, as the prefill role's pool hands them out
	err = st.Fill(0, 20)(context.Background(), ids)
	fmt.Println("staged:", err == nil, "blocks:", ids)
	fmt.Println("regions:", len(st.RegionBases()), "block_len:", st.Geometry().BlockLen(), "mem:", st.MemType())
	// Output:
	// staged: true blocks: [1 2]
	// regions: 4 block_len: 256 mem: DRAM
}
