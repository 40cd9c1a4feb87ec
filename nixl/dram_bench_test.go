package nixl_test

import (
	"fmt"
	"math/rand/v2"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gonixl/gonixl/internal/benchpeer"
	"github.com/gonixl/gonixl/internal/nixltest"
	"github.com/gonixl/gonixl/internal/testenv"
	"github.com/gonixl/gonixl/nixl"
)

// BenchmarkDRAMToDRAM READs 64 MiB per transfer from a DRAM agent in another process (internal/benchpeer)
// into this process's DRAM, in blocks of 32 KiB (Qwen3-0.6B's K or V block) and 2 MiB, scattered (a busy
// pool's random block ids) and contiguous (a fresh request's run, which NIXL merges into one descriptor;
// contiguous-nomerge: the same with nixl.WithoutDescMerge, one descriptor per block),
// with NIXL's UCX defaults and with gonixl's (nixl.DefaultUCXOptions). The baseline, in the same run, is a
// plain copy of the same bytes in this process: x_copy is NIXL's throughput over copy's.
func BenchmarkDRAMToDRAM(b *testing.B) {
	const total = 64 << 20
	gonixl, err := nixl.DefaultUCXOptions().Params()
	require.NoError(b, err)
	type variant struct {
		name   string
		params map[string]string
	}
	variants := []variant{{"nixl-defaults", nil}, {"gonixl-defaults", gonixl}}
	if os.Getenv("GONIXL_BENCH_SWEEP") != "" { // thread-pool sizes, to choose DefaultUCXOptions on a host
		for _, th := range []int{2, 4, 8, 16} {
			for _, split := range []int{4, 8, 32} {
				p, err := nixl.UCXOptions{NumThreads: th, SplitBatchSize: split}.Params()
				require.NoError(b, err)
				variants = append(variants, variant{fmt.Sprintf("threads%d-split%d", th, split), p})
			}
		}
	}
	for _, opts := range variants {
		b.Run("ucx="+opts.name, func(b *testing.B) {
			peer := benchpeer.Start(b, nixltest.Lib(b), 2*total, opts.params, false)
			a, m := peerReader(b, fmt.Sprintf("dram-bench-%s", opts.name), opts.params, peer, 2*total)
			for _, blk := range []int{32 << 10, 2 << 20} {
				nb := 2 * total / blk // blocks in each buffer; a transfer moves half of them
				ld := make([]nixl.Desc, nb)
				rd := make([]nixl.Desc, nb)
				for i := range nb {
					ld[i] = nixl.Desc{Addr: m.Addr() + uint64(i*blk), Len: uint64(blk)}
					rd[i] = nixl.Desc{Addr: peer.Addr + uint64(i*blk), Len: uint64(blk)}
				}
				lp, err := a.Prep("", nixl.DRAM, ld)
				require.NoError(b, err)
				rp, err := a.Prep(peer.Agent, nixl.DRAM, rd)
				require.NoError(b, err)
				for _, pat := range []string{"scattered", "contiguous", "contiguous-nomerge"} {
					b.Run(fmt.Sprintf("block=%dKiB/%s", blk>>10, pat), func(b *testing.B) {
						n := total / blk
						li, ri := make([]int, n), make([]int, n)
						if pat != "scattered" {
							for i := range n {
								li[i], ri[i] = 5+i, 3+i
							}
						} else {
							r := rand.New(rand.NewPCG(uint64(blk), 1))
							lperm, rperm := r.Perm(nb), r.Perm(nb)
							copy(li, lperm[:n])
							copy(ri, rperm[:n])
						}
						var xo []nixl.Option
						if pat == "contiguous-nomerge" {
							xo = append(xo, nixl.WithoutDescMerge())
						}
						x, err := a.MakeXfer(nixl.Read, lp, li, rp, ri, xo...)
						require.NoError(b, err)
						defer x.Close()
						run := func() {
							if _, err := x.Post(); err != nil {
								b.Fatal(err)
							}
							if err := x.Wait(testenv.Context(b, 30*time.Second)); err != nil {
								b.Fatal(err)
							}
						}
						run() // warm-up, then check the bytes of the first and last block
						for _, k := range []int{0, n - 1} {
							got := m.Bytes()[li[k]*blk : (li[k]+1)*blk]
							for o := 0; o < blk; o += 4093 {
								require.Equal(b, benchpeer.Pattern(uint64(ri[k]*blk+o)), got[o], "block %d offset %d", k, o)
							}
						}
						src, dst := m.Bytes()[:total], m.Bytes()[total:]
						b.SetBytes(total)
						b.ResetTimer()
						var tx, tc time.Duration
						for range b.N {
							t0 := time.Now()
							run()
							t1 := time.Now()
							copy(dst, src)
							tc += time.Since(t1)
							tx += t1.Sub(t0)
						}
						b.StopTimer()
						b.ReportMetric(float64(total)*float64(b.N)/tx.Seconds()/1e9, "GB/s")
						b.ReportMetric(float64(total)*float64(b.N)/tc.Seconds()/1e9, "copy_GB/s")
						b.ReportMetric(tc.Seconds()/tx.Seconds(), "x_copy")
					})
				}
				require.NoError(b, lp.Close())
				require.NoError(b, rp.Close())
			}
		})
	}
}

// TestBenchPeer READs from the benchmarks' DRAM peer process (internal/benchpeer) and checks its bytes, so the
// separate-process set-up of the benchmarks is tested where they do not run.
func TestBenchPeer(t *testing.T) {
	peer := benchpeer.Start(t, nixltest.Lib(t), 1<<20, nil, false)
	a, m := peerReader(t, fmt.Sprintf("benchpeer-test-%d", os.Getpid()), nil, peer, 64<<10)
	const off = 300 << 10
	x, err := a.CreateXfer(nixl.Read, nixl.DRAM, []nixl.Desc{m.Desc()}, nixl.DRAM,
		[]nixl.Desc{{Addr: peer.Addr + off, Len: uint64(m.Len())}}, peer.Agent)
	require.NoError(t, err)
	defer x.Close()
	postWait(t, testenv.Context(t, 30*time.Second), x)
	for i, v := range m.Bytes() {
		if v != benchpeer.Pattern(uint64(off+i)) {
			t.Fatalf("byte %d: %#x, want %#x", i, v, benchpeer.Pattern(uint64(off+i)))
		}
	}
}

// peerReader is a UCX agent (params: NIXL's UCX parameters, nil for its defaults) with size bytes of host
// memory registered and peer's metadata loaded, all released when tb ends.
func peerReader(tb testing.TB, name string, params map[string]string, peer *benchpeer.Peer, size int64) (*nixl.Agent, *nixl.HostMem) {
	tb.Helper()
	a, err := nixltest.Lib(tb).NewAgent(name, nixl.AgentConfig{Backends: []nixl.BackendSpec{{Plugin: "UCX", Params: params}}})
	require.NoError(tb, err)
	tb.Cleanup(func() { _ = a.Close() })
	m := hostMem(tb, size)
	reg, err := a.RegisterMem(nixl.DRAM, []nixl.Desc{m.Desc()})
	require.NoError(tb, err)
	tb.Cleanup(func() { _ = reg.Close() })
	_, err = a.LoadRemoteMetadata(peer.Metadata)
	require.NoError(tb, err)
	tb.Cleanup(func() { _ = a.InvalidateRemoteMetadata(peer.Agent) })
	return a, m
}
