package connector

import (
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/gonixl/gonixl/internal/testenv"
)

// TestMain runs the package's tests under goleak. When GONIXL_CONNECTOR_PEER is set, the test binary is
// instead a prefill server in its own process (prefillPeerMain), so tests can kill a prefill peer with
// SIGKILL in the middle of a transfer.
func TestMain(m *testing.M) {
	if os.Getenv(peerEnv) != "" {
		os.Exit(prefillPeerMain())
	}
	if os.Getenv(nsPeerEnv) != "" {
		os.Exit(nsPeerMain())
	}
	testenv.ExportNIXLLibDir()
	goleak.VerifyTestMain(m)
}
