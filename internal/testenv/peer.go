package testenv

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"testing"
	"time"
)

// A test that needs a second process (a NIXL peer, a role in a network namespace, a check that may leave a
// native library unusable) re-runs its own test binary as a peer. One convention for all of them:
//
//   - PeerEnv (GONIXL_TEST_PEER) names the peer's role; TestMain calls ServePeer first, which runs that role's
//     main and exits with its status (or returns when the variable is unset: the binary runs its tests);
//   - the peer's parameters travel as GONIXL_PEER_<NAME> variables (PeerCommand sets them, PeerParam reads them).
const PeerEnv = "GONIXL_TEST_PEER"

// peerParamPrefix starts the name of every peer parameter's variable.
const peerParamPrefix = "GONIXL_PEER_"

// Peers maps a role to the main function of a peer process; what it returns is the process's exit status.
type Peers map[string]func() int

// ServePeer runs the peer role named by $GONIXL_TEST_PEER and exits with its status; it returns at once when
// the variable is unset. An unknown role exits with status 2 and a message listing the known ones. Call it first
// in TestMain.
func ServePeer(roles Peers) {
	role := os.Getenv(PeerEnv)
	if role == "" {
		return
	}
	run, ok := roles[role]
	if !ok {
		known := make([]string, 0, len(roles))
		for r := range roles {
			known = append(known, r)
		}
		sort.Strings(known)
		fmt.Fprintf(os.Stderr, "%s=%q names no peer role of this test binary (it has %v)\n", PeerEnv, role, known)
		os.Exit(2)
	}
	os.Exit(run())
}

// PeerCommand returns a command that re-runs this test binary as the peer role, running no test or benchmark,
// with the test's environment plus each params entry as GONIXL_PEER_<NAME>=value. ctx bounds the peer (cancelled:
// killed). wrap, when given, is a command the binary runs under (e.g. "ip", "netns", "exec", ns).
func PeerCommand(ctx context.Context, role string, params map[string]string, wrap ...string) *exec.Cmd {
	args := append(append([]string(nil), wrap...), os.Args[0], "-test.run=^$", "-test.bench=^$")
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	cmd.Env = append(os.Environ(), PeerEnv+"="+role)
	names := make([]string, 0, len(params))
	for k := range params {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		cmd.Env = append(cmd.Env, peerParamPrefix+k+"="+params[k])
	}
	return cmd
}

// PeerParam is the peer parameter name ("" when the parent did not set it), read in a peer's main.
func PeerParam(name string) string { return os.Getenv(peerParamPrefix + name) }

// PeerParamInt is PeerParam as an int (0 when unset or not a number).
func PeerParamInt(name string) int {
	v, _ := strconv.Atoi(PeerParam(name))
	return v
}

// Context is a context bounded by d and cancelled when the test ends: the bound of a test's waits.
func Context(tb testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	tb.Cleanup(cancel)
	return ctx
}
