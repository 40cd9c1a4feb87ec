package testenv

import (
	"fmt"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	ServePeer(Peers{"echo": echoPeer})
	goleak.VerifyTestMain(m)
}

// echoPeer prints its parameters (TestPeerCommand's peer).
func echoPeer() int {
	fmt.Printf("echo %s %d %q\n", PeerParam("WORD"), PeerParamInt("N"), PeerParam("UNSET"))
	return 3
}
