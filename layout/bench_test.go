package layout

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"
	"time"
)

// Benchmarks convert one whole request (every layer's K and V, BHSD → paged) and compare, in the same
// run and interleaved per iteration, with a plain copy of the same number of bytes between the same
// buffers. Metrics: GB/s (converter), copy_GB/s (baseline), x_copy (converter throughput / copy
// throughput). ns/op covers the converter only.
//
//	go test ./layout -run '^$' -bench . -benchtime 20x

type benchModel struct {
	name   string
	layers int
}

var benchModels = []benchModel{{"Qwen3-0.6B", 28}, {"Llama-3.1-8B", 32}}

const benchTokens = 1024 // 64 blocks of 16; a multiple of the block size, so converter and copy move equal bytes

type benchSetup struct {
	g       Geometry
	s       Source
	q       Seq
	srcs    [][]byte // per (layer, kv): BHSD tensor
	regions [][]byte // per region
	n       int      // bytes moved per (layer, kv)
}

func newBenchSetup(m benchModel, order BlockOrder) *benchSetup {
	nb := benchTokens/16 + 1 + 16
	g := Geometry{NumLayers: m.layers, NumBlocks: nb, BlockSize: 16, NumKVHeads: 8, HeadDim: 128, DType: BF16, Order: order, Plan: PlanSplitKV}
	s := Source{Batch: 1, Heads: 8, SeqLen: benchTokens, HeadDim: 128}
	r := rand.New(rand.NewPCG(7, 8))
	perm := r.Perm(nb - 1)
	q := Seq{Tokens: benchTokens}
	for _, p := range perm[:benchTokens/16] {
		q.BlockIDs = append(q.BlockIDs, p+1)
	}
	bs := &benchSetup{g: g, s: s, q: q, n: benchTokens * int(g.TokenBytes())}
	srcLen, _ := s.Bytes(2)
	for range g.NumRegions() {
		src := make([]byte, srcLen)
		for i := range src {
			src[i] = byte(i * 7)
		}
		bs.srcs = append(bs.srcs, src)
		bs.regions = append(bs.regions, make([]byte, g.RegionLen()))
	}
	return bs
}

// convert converts regions [from, to).
func (bs *benchSetup) convert(tb testing.TB, from, to int) {
	for r := from; r < to; r++ {
		if err := bs.g.ToPaged(bs.regions[r], KV(r%2), bs.srcs[r], bs.s, bs.q); err != nil {
			tb.Fatal(err)
		}
	}
}

// copyBase copies the same number of bytes, region by region.
func (bs *benchSetup) copyBase(from, to int) {
	for r := from; r < to; r++ {
		copy(bs.regions[r][:bs.n], bs.srcs[r][:bs.n])
	}
}

// parallel runs f over the regions split into w contiguous shares, one goroutine each.
func parallel(w, regions int, f func(from, to int)) {
	var wg sync.WaitGroup
	for i := range w {
		from, to := i*regions/w, (i+1)*regions/w
		wg.Go(func() { f(from, to) })
	}
	wg.Wait()
}

func BenchmarkToPaged(b *testing.B) {
	workers := runtime.GOMAXPROCS(0)
	for _, m := range benchModels {
		for _, order := range []BlockOrder{HND, NHD} {
			for _, par := range []bool{false, true} {
				name := fmt.Sprintf("%s/%v/1core", m.name, order)
				if par {
					name = fmt.Sprintf("%s/%v/%dcores", m.name, order, workers)
				}
				b.Run(name, func(b *testing.B) {
					bs := newBenchSetup(m, order)
					R := bs.g.NumRegions()
					total := float64(bs.n) * float64(R)
					b.SetBytes(int64(total))
					b.ReportAllocs()
					bs.convert(b, 0, R) // warm: fault in every page
					bs.copyBase(0, R)
					var conv, base, serial time.Duration
					b.ResetTimer()
					for range b.N {
						b.StopTimer()
						t0 := time.Now()
						if par {
							parallel(workers, R, bs.copyBase)
						} else {
							bs.copyBase(0, R)
						}
						base += time.Since(t0)
						if par { // single-core converter time, for the scaling figure
							t0 = time.Now()
							bs.convert(b, 0, R)
							serial += time.Since(t0)
						}
						b.StartTimer()
						t0 = time.Now()
						if par {
							parallel(workers, R, func(f, t int) { bs.convert(b, f, t) })
						} else {
							bs.convert(b, 0, R)
						}
						conv += time.Since(t0)
					}
					n := float64(b.N)
					b.ReportMetric(total*n/conv.Seconds()/1e9, "GB/s")
					b.ReportMetric(total*n/base.Seconds()/1e9, "copy_GB/s")
					b.ReportMetric(base.Seconds()/conv.Seconds(), "x_copy")
					if par {
						b.ReportMetric(serial.Seconds()/conv.Seconds(), "x_1core")
					}
				})
			}
		}
	}
}

// BenchmarkFromPaged: the decode-side inverse (paged HND → BHSD), one core, against copy.
func BenchmarkFromPaged(b *testing.B) {
	for _, m := range benchModels {
		b.Run(m.name+"/HND/1core", func(b *testing.B) {
			bs := newBenchSetup(m, HND)
			R := bs.g.NumRegions()
			total := float64(bs.n) * float64(R)
			b.SetBytes(int64(total))
			b.ReportAllocs()
			bs.convert(b, 0, R)
			var conv, base time.Duration
			b.ResetTimer()
			for range b.N {
				b.StopTimer()
				t0 := time.Now()
				for r := range R {
					copy(bs.srcs[r][:bs.n], bs.regions[r][:bs.n])
				}
				base += time.Since(t0)
				b.StartTimer()
				t0 = time.Now()
				for r := range R {
					if err := bs.g.FromPaged(bs.srcs[r], bs.s, KV(r%2), bs.regions[r], bs.q); err != nil {
						b.Fatal(err)
					}
				}
				conv += time.Since(t0)
			}
			n := float64(b.N)
			b.ReportMetric(total*n/conv.Seconds()/1e9, "GB/s")
			b.ReportMetric(total*n/base.Seconds()/1e9, "copy_GB/s")
			b.ReportMetric(base.Seconds()/conv.Seconds(), "x_copy")
		})
	}
}

// BenchmarkDescIndices: index math for a 1024-token request over Llama-3.1-8B's 64 regions.
func BenchmarkDescIndices(b *testing.B) {
	bs := newBenchSetup(benchModels[1], HND)
	dst := make([]int, 0, bs.g.NumDescRegions()*len(bs.q.BlockIDs))
	b.ReportAllocs()
	for b.Loop() {
		var err error
		if dst, err = bs.g.DescIndices(bs.q.BlockIDs, dst); err != nil {
			b.Fatal(err)
		}
	}
}
