package demo

import (
	"fmt"

	"github.com/gonixl/gonixl/connector/protocol"
	"github.com/gonixl/gonixl/cuda"
	"github.com/gonixl/gonixl/layout"
)

// newGPUCache makes the decode demo's VRAM cache: NIXL READs straight into GPU memory. cuda.KVCache registers
// itself with its context current (Registrar) and is the connector's DeviceContext (Do), so the decode role
// prepares and posts its transfers with the context current too.
func newGPUCache(cfg DecodeConfig) (*cuda.KVCache, func(), error) {
	return newCUDACache(cfg, "-gpu", cuda.NewKVCache)
}

// newCUDACache makes a cache of cfg's geometry on GPU 0 with newCache; flag names the option in the errors that
// say there is no usable GPU. It returns the cache and what closes it and the device.
func newCUDACache[C interface{ Close() error }](cfg DecodeConfig, flag string,
	newCache func(*cuda.Device, layout.Geometry) (C, error)) (C, func(), error) {
	var none C
	dev, g, err := openGPU(cfg, flag)
	if err != nil {
		return none, nil, err
	}
	c, err := newCache(dev, g)
	if err != nil {
		dev.Close()
		return none, nil, err
	}
	return c, func() { c.Close(); dev.Close() }, nil
}

// openGPU opens GPU 0 and works out the geometry of cfg's cache; flag names the option in the errors that
// say there is no usable GPU.
func openGPU(cfg DecodeConfig, flag string) (*cuda.Device, layout.Geometry, error) {
	p, err := protocol.ProfileFor(cfg.VLLMVersion)
	if err != nil {
		return nil, layout.Geometry{}, err
	}
	g, err := cfg.model().Geometry(p, cfg.NumBlocks, 1)
	if err != nil {
		return nil, layout.Geometry{}, err
	}
	drv, err := cuda.Load(cuda.LoadOptions{})
	if err != nil {
		return nil, layout.Geometry{}, fmt.Errorf("%s: %w", flag, err)
	}
	dev, err := drv.Open(0)
	if err != nil {
		return nil, layout.Geometry{}, fmt.Errorf("%s: %w", flag, err)
	}
	return dev, g, nil
}

// newHostBufCache makes vLLM's host-buffered decode mode (kv_buffer_device="cpu") on a GPU: NIXL READs into a
// pinned host cache (registered as DRAM, so any backend serves it, LIBFABRIC's tcp provider too), then the
// decode role copies each request's blocks to the VRAM cache (connector.HostBuffered). The demo verifies
// what reached GPU memory.
func newHostBufCache(cfg DecodeConfig) (*cuda.HostBufferedKVCache, func(), error) {
	return newCUDACache(cfg, "-cache hostbuf", cuda.NewHostBufferedKVCache)
}
