package testenv

import (
	"errors"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// StartChild gives the child's stdout as it writes it and its stderr in a locked Buffer, pipes stdin when
// asked, and kills and reaps a child still running when the test ends.
func TestStartChild(t *testing.T) {
	var cmd *exec.Cmd
	t.Run("child", func(t *testing.T) {
		cmd = exec.Command("sh", "-c", `echo out; echo err >&2; read line; echo "got $line"; exec sleep 60`)
		c := StartChild(t, cmd, true)
		line, err := c.Stdout.ReadString('\n')
		require.NoError(t, err)
		require.Equal(t, "out\n", line)
		_, err = c.Stdin.Write([]byte("ping\n"))
		require.NoError(t, err)
		line, err = c.Stdout.ReadString('\n')
		require.NoError(t, err)
		require.Equal(t, "got ping\n", line)
		require.Eventually(t, func() bool { return strings.Contains(c.Stderr.String(), "err") }, 5e9, 1e7)
	})
	require.NotNil(t, cmd.ProcessState, "reaped when the test ended")
	require.False(t, cmd.ProcessState.Success(), "killed, not left to sleep")
}

func TestExitStderr(t *testing.T) {
	_, err := exec.Command("sh", "-c", "echo why >&2; exit 3").Output()
	require.Equal(t, "why\n", ExitStderr(err))
	require.Equal(t, "plain", ExitStderr(errors.New("plain")))
	require.Empty(t, ExitStderr(nil))
}
