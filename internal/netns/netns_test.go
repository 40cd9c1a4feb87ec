package netns

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/gonixl/gonixl/internal/testenv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// A Pair's namespaces hold lo and their veth end only, with no default route; links go down and up, the MTU
// changes on both ends; after Close both namespaces are gone. (The connector's cross-namespace tests use the
// link between them.)
func TestPair(t *testing.T) {
	if err := Check(); err != nil {
		testenv.Missing(t, "network namespaces", err.Error())
	}
	p, err := New("gonixl-test")
	require.NoError(t, err)
	closed := false
	t.Cleanup(func() {
		if !closed {
			_ = p.Close()
		}
	})
	require.NotEqual(t, p.Prefill, p.Decode)
	for _, e := range p.ends() {
		out, err := exec.Command("ip", "-n", e.ns, "-o", "route", "show", "table", "all").CombinedOutput()
		require.NoError(t, err, "%s", out)
		require.NotContains(t, string(out), "default", "no route out of %s", e.ns)
		out, err = exec.Command("ip", "-n", e.ns, "-o", "link", "show").CombinedOutput()
		require.NoError(t, err, "%s", out)
		require.Equal(t, 2, strings.Count(string(out), "\n"), "lo and the veth end only: %s", out)
		require.Contains(t, string(out), e.ifc)
	}
	require.NoError(t, p.SetLink(false))
	require.NoError(t, p.SetLink(true))
	require.NoError(t, p.OnBoth("ip", "-n", "{ns}", "link", "set", "{if}", "mtu", "1280"))
	out, err := exec.Command("ip", "-n", p.Decode, "-o", "link", "show", "dev", p.DecodeIf).CombinedOutput()
	require.NoError(t, err)
	require.Contains(t, string(out), "mtu 1280")

	require.NoError(t, p.Close())
	closed = true
	out, err = exec.Command("ip", "netns", "list").CombinedOutput()
	require.NoError(t, err)
	require.NotContains(t, string(out), p.Prefill)
	require.NotContains(t, string(out), p.Decode)
	require.NoError(t, p.Close(), "closing twice is not an error")
	env := strings.Join(DataPlaneEnv("gxp1"), " ")
	require.Contains(t, env, "UCX_NET_DEVICES=gxp1")
	require.Contains(t, env, "FI_TCP_IFACE=gxp1")
}
