package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/gonixl/gonixl/internal/testenv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func runDemo(t *testing.T, bin string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), "NIXL_LIB_DIR="+testenv.RequireNIXLLibDir(t))
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// TestDemoEndToEnd runs the whole disaggregated flow — prefill worker on a (fake) Neuron device staged through
// DRAM, decode worker, proxy — for the three layout eras (0.16: A, 0.23: B, 0.33: C) and both block orders,
// over real NIXL, and checks that every byte was verified.
func TestDemoEndToEnd(t *testing.T) {
	testenv.RequireNIXLLibDir(t)
	bin := testenv.BuildCommand(t, "disagg") // the workers are this binary re-executed
	for _, tc := range []struct{ version, order string }{{"0.16.0", "HND"}, {"0.23.0", "HND"}, {"0.33.0", "NHD"}} {
		t.Run(tc.version+"-"+tc.order, func(t *testing.T) {
			out, err := runDemo(t, bin, "-vllm-version", tc.version, "-kv-layout", tc.order, "-num-blocks", "96",
				"-lengths", "333,17,160,16", "-concurrency", "2", "-timeout", "2m")
			require.NoError(t, err, out)
			require.Contains(t, out, "OK: every byte of every request arrived intact")
			require.Regexp(t, `transfer only: [0-9.]+ GB/s aggregate`, out)
			require.Contains(t, out, "vLLM "+tc.version+" wire profile")
			for _, id := range []string{"req-1", "req-2", "req-3", "req-4"} {
				require.Contains(t, out, id)
			}
			require.NotContains(t, out, "FAILED")
			// Both workers serve /metrics (promhttp) with the roles' counters and histograms.
			require.Contains(t, out, "metrics: prefill gonixl_requests_total 4, gonixl_stage_time_seconds_count 4, decode gonixl_requests_total 4, gonixl_xfer_time_seconds_count 4")
		})
	}
}

// TestDemoTrace checks -trace: the demo writes its own execution trace and gives each worker its own file,
// and prints the phase sums it scrapes from the workers.
func TestDemoTrace(t *testing.T) {
	testenv.RequireNIXLLibDir(t)
	bin := testenv.BuildCommand(t, "disagg")
	trace := filepath.Join(t.TempDir(), "run.trace")
	out, err := runDemo(t, bin, "-num-blocks", "32", "-lengths", "40,16", "-timeout", "2m", "-trace", trace)
	require.NoError(t, err, out)
	require.Contains(t, out, "OK: every byte of every request arrived intact")
	require.Regexp(t, `phases \(seconds summed over the requests\): decode .*gonixl_xfer_post_time_seconds_sum [0-9.e-]+, gonixl_xfer_prepare_time_seconds_sum`, out)
	require.Regexp(t, `prefill gonixl_held_time_seconds_sum [0-9.e-]+`, out)
	for _, f := range []string{trace, trace + ".prefill", trace + ".decode"} {
		st, err := os.Stat(f)
		require.NoError(t, err, "the trace file %s", f)
		require.Positive(t, st.Size(), f)
	}
	b, err := os.ReadFile(trace + ".decode")
	require.NoError(t, err)
	require.Contains(t, string(b), "gonixl.Pull", "the decode worker's trace holds the pull tasks")
}

// TestDemoLIBFABRICAcrossNamespaces is the Neuron field case as far as a host without Trainium or EFA allows:
// the (fake) Neuron prefill staged through DRAM in one network namespace, read over NIXL's LIBFABRIC backend
// (libfabric's tcp provider on the veth) by a decode in another, every byte verified, the per-request table
// printed, and both namespaces gone afterwards.
func TestDemoLIBFABRICAcrossNamespaces(t *testing.T) {
	testenv.RequireNIXLLibDir(t)
	if os.Geteuid() != 0 {
		testenv.Missing(t, "root (network namespaces)", "run the tests as root")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		testenv.Missing(t, "ip (iproute2)", "apt-get install -y iproute2")
	}
	if os.Getenv("GONIXL_NIXL_DEPS") == "" {
		testenv.Missing(t, "the LIBFABRIC plugin's libraries ($GONIXL_NIXL_DEPS)", "run `make fabric-deps` (the Makefile exports GONIXL_NIXL_DEPS)")
	}
	bin := testenv.BuildCommand(t, "disagg")
	out, err := runDemo(t, bin, "-backends", "LIBFABRIC", "-vllm-version", "0.33.0", "-num-blocks", "96",
		"-lengths", "333,17,160,16", "-concurrency", "2", "-timeout", "2m")
	require.NoError(t, err, out)
	require.Regexp(t, `two hosts: network namespaces (gonixl-demo-\S+-p) \(prefill, 198\.18\.0\.1`, out)
	require.Contains(t, out, "at http://198.18.0.1:", "the prefill worker serves in its own namespace")
	require.Contains(t, out, "OK: every byte of every request arrived intact")
	require.Regexp(t, `req-4\s+16\s+1\s`, out, "the per-request table")
	ns := regexp.MustCompile(`network namespaces (\S+) \(prefill.*and (\S+) \(decode`).FindStringSubmatch(out)
	require.Len(t, ns, 3, out)
	list, err := exec.Command("ip", "netns", "list").CombinedOutput()
	require.NoError(t, err, "%s", list)
	require.NotContains(t, string(list), ns[1])
	require.NotContains(t, string(list), ns[2])
}

// TestDemoFailsLoudly checks that the demo reports failures with a non-zero exit and one clear line: a cache
// too small for the requests.
func TestDemoFailsLoudly(t *testing.T) {
	testenv.RequireNIXLLibDir(t)
	bin := testenv.BuildCommand(t, "disagg") // the workers are this binary re-executed
	out, err := runDemo(t, bin, "-num-blocks", "8", "-lengths", "333", "-timeout", "1m")
	require.Error(t, err, out)
	require.Contains(t, out, "FAILED")
	require.True(t, strings.Contains(out, "not enough free KV blocks"), out)
}

func TestBusyMS(t *testing.T) {
	require.Zero(t, busyMS(nil))
	require.Equal(t, 2.5, busyMS([][2]int64{{1000, 2000}, {1500, 3000}, {3500, 4000}}), "overlaps count once, gaps not at all")
	require.Equal(t, 2.0, busyMS([][2]int64{{5000, 6000}, {1000, 2000}, {1200, 1800}}))
}
