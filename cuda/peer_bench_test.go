package cuda_test

import (
	"fmt"
	"math/rand/v2"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gonixl/gonixl/connector"
	"github.com/gonixl/gonixl/cuda"
	"github.com/gonixl/gonixl/internal/benchpeer"
	"github.com/gonixl/gonixl/internal/nixltest"
	"github.com/gonixl/gonixl/internal/testenv"
	"github.com/gonixl/gonixl/nixl"
)

// BenchmarkDRAMToVRAM READs 128 MiB per transfer from a DRAM agent in another process (a prefill worker
// staging its KV cache in host memory; internal/benchpeer) into this process's GPU memory, in 32 KiB blocks
// (Qwen3-0.6B's K or V block) and 2 MiB blocks, scattered and contiguous, with gonixl's UCX defaults
// (nixl.DefaultUCXOptions: RMA pipeline, thread pool). Baselines in the same run, from pinned host memory of
// this process: one batch-copy call of the same block copies (x_batchcopy) and one big copy of the same
// bytes (x_bigcopy). The host-buffered path (hostbuf_*) READs into pinned DRAM of this process in 8 slices
// and copies each slice to the GPU with one batch-copy call while the next slice's READ runs.
// GONIXL_BENCH_SWEEP=1 adds variants: the peer's DRAM page-locked for CUDA (peer-pinned), a peer without a
// CUDA context, NIXL's defaults, and a sweep of UCX settings for 2 MiB contiguous runs (docs/measured.md,
// "Benchmarks and demo, H200 host", has one run's figures).
func BenchmarkDRAMToVRAM(b *testing.B) {
	dev := gpu(b)
	lib := nixltest.Lib(b)
	rma := map[string]string{nixl.UCXRMAPipeline: "y"}
	def := nixl.DefaultUCXOptions()
	withThreads := func(n, split int) nixl.UCXOptions {
		o := nixl.DefaultUCXOptions()
		o.NumThreads, o.SplitBatchSize = n, split
		return o
	}
	variants := []dramVRAMVariant{
		{name: "gonixl-defaults", opts: def, peer: benchpeer.Options{Device: true}},
		// A decode role reading into GPU memory runs without the pool (connector.RoleConfig.Backends).
		{name: "nopool", opts: withThreads(0, 0), peer: benchpeer.Options{Device: true}},
		// The same with both sides' memory registered as 56 regions, as a KV cache registers each layer's K
		// and V (Qwen3-0.6B, vLLM 0.16's layout); request shapes only, region r's run in registration r.
		{name: "nopool/regions=56", opts: withThreads(0, 0), peer: benchpeer.Options{Device: true, Regions: 56}},
		{name: "peer-pinned", opts: def, peer: benchpeer.Options{Device: true, Pin: true}},
		{name: "gonixl-defaults/peer-without-cuda", opts: def},
		{name: "rma-pipeline", opts: nixl.UCXOptions{Engine: rma}, peer: benchpeer.Options{Device: true}},
		{name: "nixl-defaults", opts: nixl.UCXOptions{}, peer: benchpeer.Options{Device: true}},
		// The 2 MiB sweep (one level each, so -test.bench '^BenchmarkDRAMToVRAM$/^ucx=/^block=2048KiB/^contiguous$'
		// selects them): UCX settings that could lift a large contiguous run (docs/measured.md).
		{name: "pinned+unmerged", opts: def, peer: benchpeer.Options{Device: true, Pin: true}, unmerged: true},
		{name: "pinned+frag16m", opts: def, peer: benchpeer.Options{Device: true, Pin: true}, env: []string{"UCX_RNDV_FRAG_SIZE", "host:512K,cuda:16M"}},
		{name: "pinned+frag1m", opts: def, peer: benchpeer.Options{Device: true, Pin: true}, env: []string{"UCX_RNDV_FRAG_SIZE", "host:512K,cuda:1M"}},
		{name: "pinned+fragalloc512", opts: def, peer: benchpeer.Options{Device: true, Pin: true}, env: []string{"UCX_RNDV_FRAG_ALLOC_COUNT", "host:128,cuda:512"}},
		{name: "pinned+fraghost", opts: def, peer: benchpeer.Options{Device: true, Pin: true}, env: []string{"UCX_RNDV_FRAG_MEM_TYPES", "host"}},
		{name: "pinned+rails4", opts: def, peer: benchpeer.Options{Device: true, Pin: true}, env: []string{"UCX_MAX_RNDV_RAILS", "4"}},
		{name: "pinned+threads4x1", opts: withThreads(4, 1), peer: benchpeer.Options{Device: true, Pin: true}},
		{name: "pinned+nopool", opts: nixl.UCXOptions{Engine: rma}, peer: benchpeer.Options{Device: true, Pin: true}},
		{name: "pinned+unmerged+threads16x1", opts: withThreads(16, 1), peer: benchpeer.Options{Device: true, Pin: true}, unmerged: true},
		{name: "nocuda+retainctx", opts: def, env: []string{"UCX_CUDA_COPY_RETAIN_PRIMARY_CTX", "y"}},
	}
	if os.Getenv("GONIXL_BENCH_SWEEP") == "" {
		variants = variants[:1]
	}
	for _, v := range variants {
		b.Run("ucx="+v.name, func(b *testing.B) {
			for i := 0; i+1 < len(v.env); i += 2 {
				b.Setenv(v.env[i], v.env[i+1]) // this process and the peer (started below) read it
			}
			params, err := v.opts.Params()
			require.NoError(b, err)
			benchDRAMToVRAM(b, dev, lib, params, v)
		})
	}
}

// dramVRAMVariant is one configuration of BenchmarkDRAMToVRAM.
type dramVRAMVariant struct {
	name     string
	opts     nixl.UCXOptions
	peer     benchpeer.Options // Device: the DRAM peer holds a CUDA context, as a prefill worker on a GPU host does; Pin: its DRAM is page-locked for CUDA
	env      []string          // UCX_* variables (name, value, ...) for both processes
	unmerged bool              // post one descriptor per block (nixl.WithoutDescMerge): the pool takes them in parallel
}

func benchDRAMToVRAM(b *testing.B, dev *cuda.Device, lib *nixl.Library, params map[string]string, v dramVRAMVariant) {
	const total = 128 << 20
	b.Logf("UCX params %v; batch copies: cuMemcpyBatchAsync ABI %d (0 = per-copy loop)", params, shared.drv.BatchCopyABI())
	peer := benchpeer.StartWith(b, lib, 2*total, params, v.peer)
	a, err := lib.NewAgent(fmt.Sprintf("vram-bench-%d", time.Now().UnixNano()), nixl.AgentConfig{
		Backends: []nixl.BackendSpec{{Plugin: "UCX", Params: params}}})
	require.NoError(b, err)
	defer a.Close()
	vram, err := dev.Alloc(2 * total)
	require.NoError(b, err)
	defer vram.Close()
	src, err := dev.AllocHost(2 * total) // the baselines' source: the same bytes, pinned, in this process
	require.NoError(b, err)
	defer src.Close()
	for i, p := 0, src.Bytes(); i < len(p); i++ {
		p[i] = benchpeer.Pattern(uint64(i))
	}
	stage, err := dev.AllocHost(2 * total) // the host-buffered path's landing zone
	require.NoError(b, err)
	defer stage.Close()
	ordinal := uint64(dev.Ordinal())
	var vreg *nixl.Registration
	require.NoError(b, dev.Do(func() (err error) {
		ds := benchpeer.Split(vram.Ptr(), vram.Len(), v.peer.Regions)
		for i := range ds {
			ds[i].DevID = ordinal
		}
		vreg, err = a.RegisterMem(nixl.VRAM, ds)
		return err
	}))
	defer vreg.Close()
	sreg, err := a.RegisterMem(nixl.DRAM, []nixl.Desc{{Addr: uint64(stage.Addr()), Len: stage.Len()}})
	require.NoError(b, err)
	defer sreg.Close()
	_, err = a.LoadRemoteMetadata(peer.Metadata)
	require.NoError(b, err)
	defer a.InvalidateRemoteMetadata(peer.Agent)
	s := newStream(b, dev)

	blocks := []int{32 << 10, 2 << 20}
	stride := 0 // request shapes: blocks from one region's run to the next (0: total/blk/regions)
	if v.peer.Regions > 1 {
		blocks = blocks[:1] // 2 MiB blocks would cross the registrations
		stride = int(benchpeer.Split(0, 2*total, v.peer.Regions)[0].Len) / blocks[0]
	}
	for _, blk := range blocks {
		nb := 2 * total / blk
		list := func(base, dv uint64) []nixl.Desc {
			out := make([]nixl.Desc, nb)
			for i := range out {
				out[i] = nixl.Desc{Addr: base + uint64(i*blk), Len: uint64(blk), DevID: dv}
			}
			return out
		}
		var vp *nixl.Prepped
		require.NoError(b, dev.Do(func() (err error) { vp, err = a.Prep("", nixl.VRAM, list(vram.Ptr(), ordinal)); return err }))
		hp, err := a.Prep("", nixl.DRAM, list(uint64(stage.Addr()), 0))
		require.NoError(b, err)
		rp, err := a.Prep(peer.Agent, nixl.DRAM, list(peer.Addr, 0))
		require.NoError(b, err)
		for _, pat := range []string{"scattered", "contiguous"} {
			if stride != 0 {
				break // request shapes only
			}
			b.Run(fmt.Sprintf("block=%dKiB/%s", blk>>10, pat), func(b *testing.B) {
				n := total / blk
				li, ri := make([]int, n), make([]int, n)
				if pat == "contiguous" {
					for i := range n {
						li[i], ri[i] = 1+i, 2+i
					}
				} else {
					r := rand.New(rand.NewPCG(uint64(blk), 2))
					copy(li, r.Perm(nb)[:n])
					copy(ri, r.Perm(nb)[:n])
				}
				ops := make([]cuda.Copy, n)
				for i := range n {
					ops[i] = cuda.Copy{Dst: vram.Ptr() + uint64(li[i]*blk), Src: uint64(src.Addr()) + uint64(ri[i]*blk), Len: uint64(blk)}
				}
				big := []cuda.Copy{{Dst: vram.Ptr(), Src: uint64(src.Addr()), Len: total}}
				var xf *nixl.Xfer
				var xo []nixl.Option
				if v.unmerged {
					xo = append(xo, nixl.WithoutDescMerge())
				}
				require.NoError(b, dev.Do(func() (err error) { xf, err = a.MakeXfer(nixl.Read, vp, li, rp, ri, xo...); return err }))
				defer xf.Close()
				const slices = 8
				per := (n + slices - 1) / slices
				var sx []*nixl.Xfer
				var sops [][]cuda.Copy
				for k := 0; k < n; k += per {
					e := min(k+per, n)
					// Unmerged, as the decode role reads into DRAM caches: the thread pool splits by descriptors.
					x, err := a.MakeXfer(nixl.Read, hp, li[k:e], rp, ri[k:e], nixl.WithoutDescMerge())
					require.NoError(b, err)
					defer x.Close()
					sx = append(sx, x)
					so := make([]cuda.Copy, 0, e-k)
					for i := k; i < e; i++ {
						so = append(so, cuda.Copy{Dst: vram.Ptr() + uint64(li[i]*blk), Src: uint64(stage.Addr()) + uint64(li[i]*blk), Len: uint64(blk)})
					}
					sops = append(sops, so)
				}
				post := func(x *nixl.Xfer) {
					if err := dev.Do(func() error { _, err := x.Post(); return err }); err != nil {
						b.Fatal(err)
					}
				}
				wait := func(x *nixl.Xfer) {
					if err := x.Wait(testenv.Context(b, time.Minute)); err != nil {
						b.Fatal(err)
					}
				}
				enqueue := func(o []cuda.Copy) {
					if err := s.Enqueue(cuda.HostToDevice, o); err != nil {
						b.Fatal(err)
					}
				}
				syncS := func() {
					if err := s.Synchronize(); err != nil {
						b.Fatal(err)
					}
				}
				hostbuf := func() {
					post(sx[0])
					for k := range sx {
						wait(sx[k])
						if k+1 < len(sx) {
							post(sx[k+1])
						}
						enqueue(sops[k])
					}
					syncS()
				}
				check := func(what string) { checkVRAM(b, vram, li, ri, blk, what) }
				// Warm up each path and check its bytes (the GPU is cleared before each).
				require.NoError(b, vram.Memset(0, vram.Len(), 0xee))
				post(xf)
				wait(xf)
				check("nixl")
				require.NoError(b, vram.Memset(0, vram.Len(), 0xee))
				hostbuf()
				check("hostbuf")
				require.NoError(b, vram.Memset(0, vram.Len(), 0xee))
				enqueue(ops)
				syncS()
				check("batchcopy")
				enqueue(big)
				syncS()

				var tN, tH, tB, tG time.Duration
				b.SetBytes(total)
				b.ResetTimer()
				for range b.N {
					t0 := time.Now()
					post(xf)
					wait(xf)
					t1 := time.Now()
					hostbuf()
					t2 := time.Now()
					enqueue(ops)
					syncS()
					t3 := time.Now()
					enqueue(big)
					syncS()
					t4 := time.Now()
					tN += t1.Sub(t0)
					tH += t2.Sub(t1)
					tB += t3.Sub(t2)
					tG += t4.Sub(t3)
				}
				b.StopTimer()
				gb := func(d time.Duration) float64 { return float64(total) * float64(b.N) / d.Seconds() / 1e9 }
				b.ReportMetric(gb(tN), "nixl_GB/s")
				b.ReportMetric(gb(tH), "hostbuf_GB/s")
				b.ReportMetric(gb(tB), "batchcopy_GB/s")
				b.ReportMetric(gb(tG), "bigcopy_GB/s")
				b.ReportMetric(tB.Seconds()/tN.Seconds(), "x_batchcopy")
				b.ReportMetric(tG.Seconds()/tN.Seconds(), "x_bigcopy")
				b.ReportMetric(tB.Seconds()/tH.Seconds(), "hostbuf_x_batchcopy")
			})
		}
		if blk == 32<<10 {
			for _, sh := range requestShapes {
				b.Run(fmt.Sprintf("block=%dKiB/request=%s", blk>>10, sh), func(b *testing.B) {
					require.NoError(b, vram.Memset(0, vram.Len(), 0xee))
					li, ri := benchRequestShape(b, a, dev, vp, rp, sh, blk, total, stride, func() { evictCaches(src.Bytes(), stage.Bytes()) })
					checkVRAM(b, vram, li, ri, blk, "request "+sh.String()) // the READ's bytes, once
				})
			}
		}
		require.NoError(b, vp.Close())
		require.NoError(b, hp.Close())
		require.NoError(b, rp.Close())
	}
}

// evictCaches reads bufs a cache line at a time, so that what the CPU caches held before is gone (bufs
// together larger than the last-level cache).
func evictCaches(bufs ...[]byte) {
	var sum byte
	for _, p := range bufs {
		for i := 0; i < len(p); i += 64 {
			sum += p[i]
		}
	}
	evictSink = sum
}

var evictSink byte

// checkVRAM checks that the first, middle and last of the blk-sized local blocks li hold the peer's pattern
// of the remote blocks ri (sampled every 4093 bytes).
func checkVRAM(b *testing.B, vram *cuda.DeviceMem, li, ri []int, blk int, what string) {
	got := make([]byte, blk)
	for _, k := range []int{0, len(li) / 2, len(li) - 1} {
		require.NoError(b, vram.Read(uint64(li[k]*blk), got))
		for o := 0; o < blk; o += 4093 {
			require.Equal(b, benchpeer.Pattern(uint64(ri[k]*blk+o)), got[o], "%s: block %d offset %d", what, k, o)
		}
	}
}

// requestShape is the READ of one demo request (examples/disagg, Qwen3-0.6B, block 16): Blocks consecutive
// blocks of BlockLen bytes in each of Regions regions, which NIXL merges into one descriptor per region. Era C
// (vLLM 0.29+) has one region per layer holding K and V (28 × 64 KiB), era A one per layer and K/V (56 × 32 KiB).
type requestShape struct {
	Regions, Blocks, BlockLen int
}

func (s requestShape) String() string {
	return fmt.Sprintf("%dx%dx%dKiB", s.Regions, s.Blocks, s.BlockLen>>10)
}

// requestShapes are the demo's smaller requests (21 and 40 blocks: 333 and 640 tokens) in both eras: issue 25
// compares each request's GB/s with the READ of the same shape through NIXL alone.
var requestShapes = []requestShape{{28, 21, 64 << 10}, {28, 40, 64 << 10}, {56, 21, 32 << 10}, {56, 40, 32 << 10}}

// benchRequestShape posts and waits for one prepared READ of shape sh (the benchmark's blk-sized descriptor
// lists vp/rp, each region a contiguous run stride blocks after the last (0: total/blk/Regions; a variant
// registering regions passes a registration's blocks), so NIXL merges a run per region and no two
// regions): NIXL's own cost for a request of that shape, without the decode role's planning, notification or
// heartbeat. Reports nixl_GB/s and the request's microseconds; then, as the decode role posts a request's
// READ, a request made for each READ and released after it, without (fresh_GB/s) and with the notification
// vLLM's READ carries (notif_GB/s), and what each adds per READ (fresh_extra_us, notif_extra_us: the
// difference of the loops' means, so noise can make it negative); and the READ after the CPU caches were
// evicted (evict, untimed), as a demo request reads blocks staged once where this loop re-reads the same
// bytes (cold_GB/s; not a baseline internal/measured uses); then the READ polled back to back (busy_GB/s, a
// baseline) and after an idle spell (idle_GB/s, idlebusy_GB/s; not baselines). It returns the descriptor
// indices read.
func benchRequestShape(b *testing.B, a *nixl.Agent, dev *cuda.Device, vp, rp *nixl.Prepped, sh requestShape, blk, total, stride int, evict func()) (li, ri []int) {
	per := sh.BlockLen / blk * sh.Blocks // descriptors per region
	if stride == 0 {
		stride = total / blk / sh.Regions
	}
	require.LessOrEqual(b, per+2, stride, "shape %s does not fit %d bytes", sh, total)
	for r := range sh.Regions {
		for j := range per {
			li, ri = append(li, 1+r*stride+j), append(ri, 2+r*stride+j)
		}
	}
	bytes := int64(len(li) * blk)
	var xf *nixl.Xfer
	require.NoError(b, dev.Do(func() (err error) { xf, err = a.MakeXfer(nixl.Read, vp, li, rp, ri); return err }))
	defer xf.Close()
	// readSpinning posts the READ and waits, polling back to back for up to spin (0: Xfer.Wait's pacing).
	readSpinning := func(spin time.Duration) func() {
		return func() {
			if err := dev.Do(func() error { _, err := xf.Post(); return err }); err != nil {
				b.Fatal(err)
			}
			if err := xf.WaitBusy(testenv.Context(b, time.Minute), spin); err != nil {
				b.Fatal(err)
			}
		}
	}
	run := readSpinning(0)
	run() // warm up
	b.SetBytes(bytes)
	b.ResetTimer()
	t0 := time.Now()
	for range b.N {
		run()
	}
	d := time.Since(t0)
	// A demo request's READ as the decode role posts it: a request made for it (MakeXfer on the prepared
	// lists), then released, without (fresh) and with (notif) the notification vLLM's READ carries.
	once := func(opts ...nixl.Option) time.Duration {
		t := time.Now()
		var x *nixl.Xfer
		if err := dev.Do(func() (err error) {
			if x, err = a.MakeXfer(nixl.Read, vp, li, rp, ri, opts...); err != nil {
				return err
			}
			_, err = x.Post()
			return err
		}); err != nil {
			b.Fatal(err)
		}
		if err := x.Wait(testenv.Context(b, time.Minute)); err != nil {
			b.Fatal(err)
		}
		if err := x.Close(); err != nil {
			b.Fatal(err)
		}
		return time.Since(t)
	}
	var dF, dN time.Duration
	for i := range b.N {
		dF += once()
		dN += once(nixl.WithNotification([]byte(fmt.Sprintf("bench-%d", i))))
	}
	// read's time over b.N READs, each after wait (untimed).
	after := func(wait func(), read func()) (d time.Duration) {
		for range b.N {
			b.StopTimer()
			wait()
			b.StartTimer()
			t := time.Now()
			read()
			d += time.Since(t)
		}
		return d
	}
	// The same READ from a source no CPU cache holds (a demo request reads blocks the prefill staged once):
	// the caches are evicted, untimed, before each.
	dC := after(evict, run)
	// The same READ waited for by polling back to back (nixl.Xfer.WaitBusy, as the decode role waits for a READ
	// into GPU memory: connector.DefaultReadSpin), again and again (busy_GB/s); then each after the machine
	// sat idle as long as a demo request's other phases take, untimed (idle_GB/s waited for as the loop above,
	// idlebusy_GB/s polled back to back): what a READ loses to idle cores and devices waking up.
	// GONIXL_BENCH_IDLE=1 adds a shorter idle (idle5ms_GB/s), this process spinning on a CPU instead
	// (spin_GB/s) and the GPU kept busy by memsets meanwhile (gpubusy_GB/s).
	busy := readSpinning(connector.DefaultReadSpin)
	none := func() {}
	idle := func() { time.Sleep(50 * time.Millisecond) }
	dB := after(none, busy)
	dI := after(idle, run)
	dIB := after(idle, busy)
	var dI5, dS, dG time.Duration
	if os.Getenv("GONIXL_BENCH_IDLE") != "" {
		scratch, err := dev.Alloc(64 << 20)
		require.NoError(b, err)
		defer scratch.Close()
		dI5 = after(func() { time.Sleep(5 * time.Millisecond) }, run)
		dS = after(func() {
			for t := time.Now(); time.Since(t) < 50*time.Millisecond; {
			}
		}, run)
		dG = after(func() {
			for t := time.Now(); time.Since(t) < 50*time.Millisecond; {
				if err := scratch.Memset(0, scratch.Len(), 1); err != nil {
					b.Fatal(err)
				}
				time.Sleep(100 * time.Microsecond)
			}
		}, run)
	}
	b.StopTimer()
	gb := func(d time.Duration) float64 { return float64(bytes) * float64(b.N) / d.Seconds() / 1e9 }
	b.ReportMetric(gb(d), "nixl_GB/s")
	b.ReportMetric(float64(d.Microseconds())/float64(b.N), "us/request")
	b.ReportMetric(gb(dF), "fresh_GB/s")
	b.ReportMetric(gb(dN), "notif_GB/s")
	b.ReportMetric(float64(dF-d)/float64(b.N)/1e3, "fresh_extra_us")
	b.ReportMetric(float64(dN-dF)/float64(b.N)/1e3, "notif_extra_us")
	b.ReportMetric(gb(dC), "cold_GB/s")
	b.ReportMetric(gb(dB), "busy_GB/s")
	b.ReportMetric(gb(dI), "idle_GB/s")
	b.ReportMetric(gb(dIB), "idlebusy_GB/s")
	if dS > 0 {
		b.ReportMetric(gb(dI5), "idle5ms_GB/s")
		b.ReportMetric(gb(dS), "spin_GB/s")
		b.ReportMetric(gb(dG), "gpubusy_GB/s")
	}
	return li, ri
}
