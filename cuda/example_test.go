package cuda_test

import (
	"fmt"
	"log"

	"github.com/gonixl/gonixl/cuda"
	"github.com/gonixl/gonixl/layout"
	"github.com/gonixl/gonixl/nixl"
)

// Load the driver, open a device, round-trip bytes through device memory.
func Example() {
	drv, err := cuda.Load(cuda.LoadOptions{})
	if err != nil {
		log.Fatal(err) // errors.Is(err, cuda.ErrNotLoaded): no NVIDIA driver on this machine
	}
	dev, err := drv.Open(0)
	if err != nil {
		log.Fatal(err)
	}
	defer dev.Close()
	m, err := dev.Alloc(1 << 20)
	if err != nil {
		log.Fatal(err)
	}
	defer m.Close()
	if err := m.Write(0, []byte("hello, GPU")); err != nil {
		log.Fatal(err)
	}
	buf := make([]byte, 10)
	if err := m.Read(0, buf); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s on %s\n", buf, dev.Props().Name)
}

// A decode rank's VRAM KV cache: allocate it from the geometry, register it with a NIXL agent, and hand
// the handshake fields (region bases, block lengths, memory type, device id) to the connector.
func ExampleNewKVCache() {
	dev := openGPU0()
	defer dev.Close()
	g := qwen3Geometry(1024)
	kv, err := cuda.NewKVCache(dev, g)
	if err != nil {
		log.Fatal(err)
	}
	defer kv.Close() // deregisters, then frees

	lib, err := nixl.Load(nixl.LoadOptions{})
	if err != nil {
		log.Fatal(err)
	}
	agent, err := lib.NewAgent("decode-0", nixl.AgentConfig{Backends: []nixl.BackendSpec{{Plugin: "UCX"}}})
	if err != nil {
		log.Fatal(err)
	}
	defer agent.Close()
	if _, err := kv.Register(agent); err != nil {
		log.Fatal(err)
	}
	fmt.Println(kv.MemType(), kv.DeviceID(), len(kv.RegionBases()), kv.BlockLens()[0])
}

// Host-buffered decode (vLLM kv_buffer_device="cpu"): NIXL reads into a pinned host cache, then the
// request's blocks go to the GPU in one batch.
func ExampleKVCache_CopyFromHost() {
	dev := openGPU0()
	defer dev.Close()
	g := qwen3Geometry(256)
	host, err := cuda.NewHostKVCache(dev, g)
	if err != nil {
		log.Fatal(err)
	}
	defer host.Close()
	kv, err := cuda.NewKVCache(dev, g)
	if err != nil {
		log.Fatal(err)
	}
	defer kv.Close()
	// ... NIXL READ into host blocks 1..3 ...
	if err := kv.CopyFromHost(host, []int{1, 2, 3}, []int{10, 11, 12}, nil); err != nil {
		log.Fatal(err)
	}
}

// openGPU0 loads the driver and opens device 0, as Example does.
func openGPU0() *cuda.Device {
	drv, err := cuda.Load(cuda.LoadOptions{})
	if err != nil {
		log.Fatal(err)
	}
	dev, err := drv.Open(0)
	if err != nil {
		log.Fatal(err)
	}
	return dev
}

// qwen3Geometry is Qwen3-0.6B's KV cache in vLLM's HND layout with numBlocks blocks of 16 tokens.
func qwen3Geometry(numBlocks int) layout.Geometry {
	return layout.Geometry{NumLayers: 28, NumBlocks: numBlocks, BlockSize: 16, NumKVHeads: 8, HeadDim: 128,
		DType: layout.BF16, Order: layout.HND, Plan: layout.PlanSplitKV}
}
