package testenv

import (
	"bufio"
	"io"
	"os/exec"
	"testing"
	"time"
)

// Child is a test's child process whose output is read while it runs: Stdout is its standard output, read
// line by line as the child writes it; Stderr collects its standard error in a locked Buffer; Stdin (when
// asked for) is its standard input, whose closing is the signal to exit for gonixl's Python peers.
type Child struct {
	Cmd    *exec.Cmd
	Stdin  io.WriteCloser
	Stdout *bufio.Reader
	Stderr *Buffer
}

// StartChild starts cmd with its stdout piped and its stderr in a locked Buffer (and its stdin piped when
// stdin is true; Wait gives up on the pipes 5 s after the child exits unless cmd.WaitDelay says otherwise);
// when the test ends the child is killed (if still running) and waited for. A caller may
// Wait for it first, from the test's goroutine; the clean-up's second Wait then only returns an error.
func StartChild(tb testing.TB, cmd *exec.Cmd, stdin bool) *Child {
	tb.Helper()
	c := &Child{Cmd: cmd, Stderr: &Buffer{}}
	cmd.Stderr = c.Stderr
	if cmd.WaitDelay == 0 {
		// A grandchild that inherited stderr (a shell's, Python's workers) would keep Wait copying forever.
		cmd.WaitDelay = 5 * time.Second
	}
	if stdin {
		w, err := cmd.StdinPipe()
		if err != nil {
			tb.Fatalf("stdin of %s: %v", cmd.Path, err)
		}
		c.Stdin = w
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatalf("stdout of %s: %v", cmd.Path, err)
	}
	if err := cmd.Start(); err != nil {
		tb.Fatalf("starting %s: %v", cmd.Path, err)
	}
	c.Stdout = bufio.NewReader(out)
	tb.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return c
}

// ExitStderr is the standard error an exec.Cmd.Output call kept in its *exec.ExitError, else err's text
// (empty for nil): the message to show when a child run with Output failed.
func ExitStderr(err error) string {
	if ee, ok := err.(*exec.ExitError); ok {
		return string(ee.Stderr)
	}
	if err != nil {
		return err.Error()
	}
	return ""
}
