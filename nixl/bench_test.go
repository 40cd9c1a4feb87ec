package nixl_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gonixl/gonixl/internal/testenv"
	"github.com/gonixl/gonixl/nixl"
)

const benchTotal = 64 << 20

// BenchmarkRead measures READ throughput of 64 MiB split into descriptors of 4 KiB, 64 KiB and 1 MiB, one
// prepared request reposted per iteration, and runs the same workload through the NIXL wheel's Python API
// (nixl._api.nixl_agent, what vLLM calls) in the same run: go/py is Go's throughput over Python's.
func BenchmarkRead(b *testing.B) {
	for _, desc := range []int{4 << 10, 64 << 10, 1 << 20} {
		b.Run(fmt.Sprintf("desc=%dKiB", desc>>10), func(b *testing.B) {
			p := newPair(b, benchTotal)
			n := benchTotal / desc
			local := make([]nixl.Desc, n)
			remote := make([]nixl.Desc, n)
			idx := make([]int, n)
			for i := range local {
				local[i] = nixl.Desc{Addr: p.initMem.Addr() + uint64(i*desc), Len: uint64(desc)}
				remote[i] = nixl.Desc{Addr: p.targetMem.Addr() + uint64(i*desc), Len: uint64(desc)}
				idx[i] = i
			}
			lp, err := p.init.Prep("", nixl.DRAM, local)
			require.NoError(b, err)
			defer lp.Close()
			rp, err := p.init.Prep(p.target.Name(), nixl.DRAM, remote)
			require.NoError(b, err)
			defer rp.Close()
			x, err := p.init.MakeXfer(nixl.Read, lp, idx, rp, idx)
			require.NoError(b, err)
			defer x.Close()
			ctx := context.Background()
			run := func() {
				if _, err := x.Post(); err != nil {
					b.Fatal(err)
				}
				if err := x.Wait(ctx); err != nil {
					b.Fatal(err)
				}
			}
			run() // warm-up: connection set-up
			b.SetBytes(benchTotal)
			b.ResetTimer()
			start := time.Now()
			for i := 0; i < b.N; i++ {
				run()
			}
			elapsed := time.Since(start)
			b.StopTimer()
			goGBps := float64(benchTotal) * float64(b.N) / elapsed.Seconds() / 1e9
			b.ReportMetric(goGBps, "GB/s")
			if py := pythonReadGBps(b, desc); py > 0 {
				b.ReportMetric(py, "py_GB/s")
				b.ReportMetric(goGBps/py, "go/py")
			}
		})
	}
}

func pythonReadGBps(b *testing.B, desc int) float64 {
	py := testenv.Python(b)
	testenv.PythonModules(b, py, "numpy")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	script := filepath.Join(testenv.RepoRoot(), "python", "bench_nixl_read.py")
	out, err := exec.CommandContext(ctx, py, script, "--desc", strconv.Itoa(desc), "--total", strconv.Itoa(benchTotal)).Output()
	require.NoError(b, err, "python benchmark: %s", out)
	var res struct{ GBps float64 }
	lines := splitLines(out)
	require.NoError(b, json.Unmarshal(lines[len(lines)-1], &res), "python benchmark output: %s", out)
	return res.GBps
}

func splitLines(b []byte) [][]byte {
	var out [][]byte
	start := 0
	for i, c := range b {
		if c == '\n' {
			if i > start {
				out = append(out, b[start:i])
			}
			start = i + 1
		}
	}
	if start < len(b) {
		out = append(out, b[start:])
	}
	return out
}

// BenchmarkBuildPost1M measures the Go-side cost of building and posting one request of 1M descriptors
// (register nothing new; CreateXfer prepares both lists and makes the request), in ns per descriptor.
func BenchmarkBuildPost1M(b *testing.B) {
	const n, dlen = 1 << 20, 64
	p := newPair(b, n*dlen)
	local := make([]nixl.Desc, n)
	remote := make([]nixl.Desc, n)
	for i := range local {
		local[i] = nixl.Desc{Addr: p.initMem.Addr() + uint64(i*dlen), Len: dlen}
		remote[i] = nixl.Desc{Addr: p.targetMem.Addr() + uint64(i*dlen), Len: dlen}
	}
	var build, post time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		x, err := p.init.CreateXfer(nixl.Read, nixl.DRAM, local, nixl.DRAM, remote, p.target.Name())
		if err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if _, err := x.Post(); err != nil {
			b.Fatal(err)
		}
		t2 := time.Now()
		build += t1.Sub(t0)
		post += t2.Sub(t1)
		b.StopTimer()
		if err := x.Wait(context.Background()); err != nil {
			b.Fatal(err)
		}
		if err := x.Close(); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	b.ReportMetric(float64(build.Nanoseconds())/float64(b.N)/n, "build_ns/desc")
	b.ReportMetric(float64(post.Nanoseconds())/float64(b.N)/n, "post_ns/desc")
}
