package neuron

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/gonixl/gonixl/internal/nixltest"
	"github.com/gonixl/gonixl/layout"
	"github.com/gonixl/gonixl/nixl"
)

// Qwen3-0.6B-shaped cache (28 layers, 8 KV heads, head_dim 128, bf16, block 16) and one 512-token request:
// 56 MiB of KV to stage.
const benchTokens = 512

func benchSetup(b *testing.B, workers int, device bool, agent *nixl.Agent) (*Stager, Request, *testCache) {
	b.Helper()
	spec := SourceSpec{DType: layout.BF16, Shape: layout.Source{Batch: 1, Heads: 8, SeqLen: benchTokens, HeadDim: 128}, NumLayers: 28}
	c := newTestCache(spec)
	var src Source = c.host(b)
	if device {
		rt := openFake(b, LoadOptions{})
		src = c.device(b, rt)
	}
	nb := benchTokens/16 + 1
	g := layout.Geometry{NumLayers: 28, NumBlocks: nb, BlockSize: 16, NumKVHeads: 8, HeadDim: 128, DType: layout.BF16, Order: layout.HND, Plan: layout.PlanSplitKV}
	s := newStager(b, StagerConfig{Geometry: g, Source: src, Workers: workers, Lock: LockBestEffort})
	if agent != nil {
		registerArena(b, agent, s)
	}
	return s, Request{ID: "bench", Tokens: benchTokens, BlockIDs: blockRange(1, nb-1)}, c
}

// hostCopyNs is the in-run baseline: the best of a few plain copies of the request's bytes (every layer's K
// and V rows) into the arena, with no device, layout or block work.
func hostCopyNs(s *Stager, c *testCache) float64 {
	best := time.Duration(1 << 62)
	for range 5 {
		start := time.Now()
		r := 0
		for l := range c.spec.NumLayers {
			for _, src := range [][]byte{c.k[l], c.v[l]} {
				copy(s.Region(r), src)
				r++
			}
		}
		best = min(best, time.Since(start))
	}
	return float64(best.Nanoseconds())
}

func stageNs(b *testing.B, s *Stager, req Request, reps int) float64 {
	best := time.Duration(1 << 62)
	for range reps {
		start := time.Now()
		if err := s.Stage(context.Background(), req); err != nil {
			b.Fatal(err)
		}
		best = min(best, time.Since(start))
	}
	return float64(best.Nanoseconds())
}

// BenchmarkStageQwen3 stages one 512-token request of a Qwen3-0.6B-shaped cache. Metrics: x_hostcopy is the
// time per Stage divided by a plain host copy of the same bytes measured in the same run; for the
// pipelined variants, speedup_vs_serial compares with one-worker staging measured in the same run.
func BenchmarkStageQwen3(b *testing.B) {
	for _, bc := range []struct {
		name    string
		workers int
		device  bool
		delayUs int64 // fake device latency per read
	}{
		{"device/serial", 1, true, 0},
		{"device/pipelined", 0, true, 0},
		{"device-latency50us/serial", 1, true, 50},
		{"device-latency50us/pipelined", 0, true, 50},
		{"host/pipelined", 0, false, 0},
	} {
		b.Run(bc.name, func(b *testing.B) {
			s, req, c := benchSetup(b, bc.workers, bc.device, nil)
			if bc.delayUs > 0 {
				if src, ok := s.src.(*DeviceSource); ok {
					src.rt.fakeCtl("read_delay_us", bc.delayUs, true)
				}
			}
			base := hostCopyNs(s, c)
			var serial float64
			if bc.workers != 1 {
				saved := s.workers
				s.workers = 1
				serial = stageNs(b, s, req, 2)
				s.workers = saved
			}
			b.SetBytes(int64(2 * 28 * benchTokens * 8 * 128 * 2))
			b.ResetTimer()
			for b.Loop() {
				if err := s.Stage(context.Background(), req); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			per := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
			b.ReportMetric(per/base, "x_hostcopy")
			if serial > 0 {
				b.ReportMetric(serial/per, "speedup_vs_serial")
			}
		})
	}
}

// BenchmarkStageAndNIXLRead stages the request and has a second NIXL agent READ every block of it (UCX,
// same host), end to end; x_hostcopy compares with the plain host copy measured in the same run.
func BenchmarkStageAndNIXLRead(b *testing.B) {
	prefill, decode := nixltest.Agent(b, "bprefill"), nixltest.Agent(b, "bdecode")
	s, req, c := benchSetup(b, 0, true, prefill)
	g := s.Geometry()
	_, dbases := peerArena(b, decode, g)
	md, err := prefill.LocalMetadata()
	if err != nil {
		b.Fatal(err)
	}
	remote, err := decode.LoadRemoteMetadata(md)
	if err != nil {
		b.Fatal(err)
	}
	defer decode.InvalidateRemoteMetadata(remote)
	rd, _ := s.Descs()
	ld, _ := g.Descs(dbases, 0)
	lds := make([]nixl.Desc, len(ld))
	for i, d := range ld {
		lds[i] = nixl.Desc(d)
	}
	rp, err := decode.Prep(remote, nixl.DRAM, rd)
	if err != nil {
		b.Fatal(err)
	}
	defer rp.Close()
	lp, err := decode.Prep("", nixl.DRAM, lds)
	if err != nil {
		b.Fatal(err)
	}
	defer lp.Close()
	idx, err := g.DescIndices(req.BlockIDs, nil)
	if err != nil {
		b.Fatal(err)
	}
	x, err := decode.MakeXfer(nixl.Read, lp, idx, rp, idx)
	if err != nil {
		b.Fatal(err)
	}
	defer x.Close()
	base := hostCopyNs(s, c)
	b.SetBytes(int64(2 * 28 * benchTokens * 8 * 128 * 2))
	b.ResetTimer()
	for b.Loop() {
		if err := s.Stage(context.Background(), req); err != nil {
			b.Fatal(err)
		}
		if _, err := x.Post(); err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err := x.Wait(ctx)
		cancel()
		if err != nil {
			b.Fatal(fmt.Errorf("READ: %w", err))
		}
	}
	b.StopTimer()
	per := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
	b.ReportMetric(per/base, "x_hostcopy")
}
