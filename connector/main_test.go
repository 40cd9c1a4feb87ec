package connector

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/gonixl/gonixl/internal/testenv"
)

// TestMain runs the package's tests under goleak. Started as a peer (testenv.PeerCommand), the test binary is
// instead a prefill server in its own process (prefillPeerMain), so tests can kill a prefill peer with SIGKILL
// in the middle of a transfer, or a role inside a network namespace (nsPeerMain).
func TestMain(m *testing.M) {
	testenv.ServePeer(testenv.Peers{
		"prefill":       prefillPeerMain,
		"netns-prefill": func() int { return nsPeerMain("prefill") },
		"netns-decode":  func() int { return nsPeerMain("decode") },
	})
	testenv.ExportNIXLLibDir()
	goleak.VerifyTestMain(m)
}
