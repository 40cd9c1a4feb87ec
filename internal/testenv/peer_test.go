package testenv

import (
	"context"
	"errors"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// PeerCommand re-runs the test binary as the role; ServePeer runs that role's main with the parameters and
// exits with its status.
func TestPeerCommand(t *testing.T) {
	out, err := PeerCommand(Context(t, time.Minute), "echo", map[string]string{"WORD": "hi", "N": "42"}).Output()
	var ee *exec.ExitError
	require.True(t, errors.As(err, &ee), "%v", err)
	require.Equal(t, 3, ee.ExitCode(), "the role's status: %s", ee.Stderr)
	require.Equal(t, "echo hi 42 \"\"\n", string(out))
}

func TestPeerCommandWrapped(t *testing.T) {
	out, err := PeerCommand(context.Background(), "echo", map[string]string{"WORD": "wrapped"}, "env").Output()
	require.Error(t, err)
	require.Equal(t, "echo wrapped 0 \"\"\n", string(out))
}

func TestServePeerUnknownRole(t *testing.T) {
	out, err := PeerCommand(context.Background(), "nosuchrole", nil).CombinedOutput()
	var ee *exec.ExitError
	require.True(t, errors.As(err, &ee), "%v", err)
	require.Equal(t, 2, ee.ExitCode())
	require.Contains(t, string(out), `GONIXL_TEST_PEER="nosuchrole" names no peer role of this test binary (it has [echo])`)
}

func TestContext(t *testing.T) {
	var ctx context.Context
	t.Run("inner", func(t *testing.T) {
		ctx = Context(t, time.Hour)
		dl, ok := ctx.Deadline()
		require.True(t, ok)
		require.WithinDuration(t, time.Now().Add(time.Hour), dl, time.Minute)
		require.NoError(t, ctx.Err())
	})
	require.ErrorIs(t, ctx.Err(), context.Canceled, "cancelled when the test ended")
}
