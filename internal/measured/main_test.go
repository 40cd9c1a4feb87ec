package main

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden.md")

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestGolden renders the fixtures (testdata/cpu: a real bench-vllm pass and demo run, edited into a second
// pass and a failed third; testdata/gpu: synthetic gpu-perreq.sh logs) and compares with the golden files:
// the spreads, the per-pass ratios to the strongest baseline of the request's shape, and failed runs left out.
func TestGolden(t *testing.T) {
	dir := t.TempDir()
	readme := filepath.Join(dir, "README.md")
	require.NoError(t, os.WriteFile(readme, []byte("# x\n\n## Measured\n\n"+BeginMarker+"\nold\n"+EndMarker+"\n\n## Next\n"), 0o644))
	full := filepath.Join(dir, "bench.md")
	require.NoError(t, run("testdata/cpu", "testdata/gpu", readme, full, "the fixtures", nil))
	for _, f := range []struct{ got, golden string }{{readme, "testdata/readme.golden.md"}, {full, "testdata/full.golden.md"}} {
		got, err := os.ReadFile(f.got)
		require.NoError(t, err)
		if *update {
			require.NoError(t, os.WriteFile(f.golden, got, 0o644))
			continue
		}
		want, err := os.ReadFile(f.golden)
		require.NoError(t, err, "go test ./internal/measured -update writes it")
		require.Equal(t, string(want), string(got))
	}
}

// TestRatios checks the figures the goals are stated in by value, not through the golden file.
func TestRatios(t *testing.T) {
	var b strings.Builder
	require.NoError(t, writeGPU(&b, "testdata/gpu"))
	out := b.String()
	// vLLM 0.33 one at a time, pass 1: 21 blocks 20 GB/s over request=28x21x64KiB's 30, 188 blocks 40 over
	// the strongest contiguous 45; pass 2: 26 over 30, 42 over 50. Aggregates: 35 GB/s over the 249 blocks'
	// NIXL-only bandwidth, 249 / (40/40 + 21/30 + 188/45) = 42.4 GB/s, and 36 over 249 / (… + 188/50) = 45.6.
	require.Contains(t, out, "| disagg, vLLM 0.33.0, 1 in flight | 4 of 6 | 21 blocks 0.67 / 0.87 / 0.87; 40 blocks 0.75 / 0.90 / 0.90; 188 blocks 0.84 / 0.89 / 0.89 | 0.79 / 0.83 / 0.83 |")
	// vLLM 0.16's 21 blocks against era A's shape (56 regions): 12 over 25, the shape's fresh_GB/s (a request
	// made per READ), which beats its nixl_GB/s (20) in that pass.
	require.Contains(t, out, "| disagg, vLLM 0.16.0, 1 in flight | 2 of 3 | 21 blocks 0.48")
	require.Contains(t, out, "vLLM 0.16.0, 4 in flight (1 of 1 runs failed) | 0 of 0 | – | – |")
	require.Contains(t, out, "GPU host (2026-12-06 21:00 UTC, NVIDIA H200")
}

func TestErrors(t *testing.T) {
	require.ErrorContains(t, run("", "", "", "", "", nil), "give -cpu")
	require.ErrorContains(t, run("", t.TempDir(), "", "", "", nil), "no bench-pN.log")
	readme := filepath.Join(t.TempDir(), "README.md")
	require.NoError(t, os.WriteFile(readme, []byte("no markers\n"), 0o644))
	require.ErrorContains(t, run("testdata/cpu", "", readme, "", "", nil), "has no")
}

// TestREADMEHasSection: `make measured` rewrites README between the markers, so they must be there.
func TestREADMEHasSection(t *testing.T) {
	b, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	s := string(b)
	i, j := strings.Index(s, BeginMarker), strings.Index(s, EndMarker)
	require.True(t, i >= 0 && j > i, "README.md lacks the measured markers")
}
