package demo

import (
	"fmt"
	"github.com/gonixl/gonixl/connector/protocol"

	"github.com/gonixl/gonixl/cuda"
	"github.com/gonixl/gonixl/nixl"
)

// gpuCache is a VRAM KV cache for the decode demo: NIXL READs straight into GPU memory; the demo reads regions
// back to host memory to verify them.
type gpuCache struct {
	*cuda.KVCache
}

// ReadRegion copies region r back to host memory.
func (c gpuCache) ReadRegion(r int, dst []byte) error {
	g := c.Geometry()
	return c.Mem().Read(uint64(g.RegionOffset(r)), dst[:g.RegionLen()])
}

// Register registers the cache with the decode agent with the device's context current (UCX needs it).
func (c gpuCache) Register(a *nixl.Agent, opts ...nixl.Option) (*nixl.Registration, error) {
	return c.KVCache.Register(a, opts...)
}

// Do runs fn with the GPU's context current (the decode role prepares and posts NIXL transfers through it).
func (c gpuCache) Do(fn func() error) error { return c.Device().Do(fn) }

func newGPUCache(cfg DecodeConfig) (gpuCache, func(), error) {
	drv, err := cuda.Load(cuda.LoadOptions{})
	if err != nil {
		return gpuCache{}, nil, fmt.Errorf("-gpu: %w", err)
	}
	dev, err := drv.Open(0)
	if err != nil {
		return gpuCache{}, nil, fmt.Errorf("-gpu: %w", err)
	}
	p, err := profileFor(cfg.VLLMVersion)
	if err != nil {
		dev.Close()
		return gpuCache{}, nil, err
	}
	g, err := cfg.Model.Geometry(p, cfg.NumBlocks, 1)
	if err != nil {
		dev.Close()
		return gpuCache{}, nil, err
	}
	kv, err := cuda.NewKVCache(dev, g)
	if err != nil {
		dev.Close()
		return gpuCache{}, nil, err
	}
	return gpuCache{kv}, func() { kv.Close(); dev.Close() }, nil
}

func profileFor(v string) (protocol.Profile, error) { return protocol.ProfileFor(v) }
