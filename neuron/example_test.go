package neuron_test

import (
	"context"
	"fmt"
	"os"

	"github.com/gonixl/gonixl/layout"
	"github.com/gonixl/gonixl/neuron"
	"github.com/gonixl/gonixl/neuron/neurontest"
	"github.com/gonixl/gonixl/nixl"
)

// The connector package's cache and block-allocator interfaces, which a Stager satisfies structurally
// (copied here so that this package does not depend on the connector).
type cache interface {
	Geometry() layout.Geometry
	MemType() nixl.MemType
	DeviceID() uint64
	RegionBases() []uint64
}

type blockAllocator interface {
	Reserve(n int) ([]int, error)
	Release(ids []int) error
}

var (
	_ cache          = (*neuron.Stager)(nil)
	_ blockAllocator = (*neuron.Stager)(nil)
)

// Staging a prefill request from (fake) Neuron device tensors into the host arena a decode peer reads.
// With a real Trainium the only change is Options.Path (or nothing: libnrt.so.1 is found by itself), and
// StagerConfig.Agent registers the arena with NIXL.
func Example() {
	dir, _ := os.MkdirTemp("", "fakenrt")
	defer os.RemoveAll(dir)
	lib, err := neurontest.Build(dir) // no Trainium here: the fake libnrt, same dlopen path
	if err != nil {
		fmt.Println(err)
		return
	}
	rt, err := neuron.Open(neuron.Options{Path: lib})
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

	ids, _ := st.Reserve(2) // 20 tokens at block size 16
	err = st.Stage(context.Background(), neuron.Request{ID: "req-1", Tokens: 20, BlockIDs: ids})
	fmt.Println("staged:", err == nil, "ready:", st.Ready("req-1"), "blocks:", ids)
	fmt.Println("regions:", len(st.RegionBases()), "block_len:", st.Geometry().BlockLen(), "mem:", st.MemType())
	_ = st.Release(ids) // on the decode peer's notification
	fmt.Println("ready after release:", st.Ready("req-1"))
	// Output:
	// staged: true ready: true blocks: [1 2]
	// regions: 4 block_len: 256 mem: DRAM
	// ready after release: false
}
