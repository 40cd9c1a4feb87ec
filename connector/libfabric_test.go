package connector

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gonixl/gonixl/nixl"
)

// The roles over NIXL's LIBFABRIC backend (the field configuration "backends": ["LIBFABRIC"]) with a non-EFA
// libfabric provider (FI_PROVIDER, default tcp; NIXL 1.5.1's plugin takes only cxi, efa, tcp or sockets). The
// plugin of the nixl-cu12/cu13 1.5.1 wheels needs libfabric ≥ 2.7 (symbol version FABRIC_1.10), the CUDA
// runtime of its major, libhwloc.so.15 and libcuda.so.1 (scripts/fabric-deps.sh provides all but libfabric;
// `gonixl env` names what is missing), so on a host without them it cannot be loaded: the test then skips
// with NIXL's error, unless GONIXL_TEST_LIBFABRIC=1 says the host must have it.
func TestRolesOverLIBFABRIC(t *testing.T) {
	l := testLib(t)
	if os.Getenv("FI_PROVIDER") == "" {
		t.Setenv("FI_PROVIDER", "tcp")
	}
	backends := ParseBackends([]string{"LIBFABRIC"})
	probe, err := l.NewAgent(fmt.Sprintf("libfabric-probe-%d", time.Now().UnixNano()), nixl.AgentConfig{Backends: backends})
	if err != nil {
		if os.Getenv("GONIXL_TEST_LIBFABRIC") != "" {
			t.Fatalf("LIBFABRIC backend required (GONIXL_TEST_LIBFABRIC set) but cannot be created: %v", err)
		}
		t.Skipf("NIXL's LIBFABRIC plugin cannot be created on this host (FI_PROVIDER=%s): %v; it needs libfabric >= 2.7 "+
			"(FABRIC_1.10), the CUDA runtime, libhwloc.so.15 and libcuda.so.1 (`gonixl env` names what is missing; "+
			"scripts/fabric-deps.sh) — set GONIXL_TEST_LIBFABRIC=1 where they are present",
			os.Getenv("FI_PROVIDER"), err)
	}
	require.NoError(t, probe.Close())
	for _, p := range roleProfiles() {
		t.Run(p.Name, func(t *testing.T) {
			pr := newPair(t, p, pairOpts{backends: backends})
			ctx := ctxT(t, 30*time.Second)
			kv := pr.prefill(t, ctx, "lf", 40, 77)
			local := localBlocks(3, 0)
			res, err := pr.dec.Pull(ctx, "lf", kv, local)
			require.NoError(t, err)
			requirePattern(t, pr.dcache, local, kv.RemoteBlockIDs[0], 77)
			t.Logf("LIBFABRIC (%s): %d bytes in %v", os.Getenv("FI_PROVIDER"), res.Bytes, res.Transfer)
			require.Eventually(t, func() bool { return pr.pre.Held() == 0 }, 30*time.Second, 5*time.Millisecond)
			require.Equal(t, "LIBFABRIC", pr.pre.Agent().Backends()[0].Plugin())
		})
	}
}
