package main

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/gonixl/gonixl/internal/testenv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// worker is a running prefill worker whose temporary files go to its own TMPDIR.
type worker struct {
	cmd    *exec.Cmd
	tmp    string
	stderr *testenv.Buffer
	ready  chan struct{}
}

func startWorker(t *testing.T, ctx context.Context, bin string) *worker {
	t.Helper()
	w := &worker{tmp: t.TempDir(), ready: make(chan struct{})}
	w.cmd = exec.CommandContext(ctx, bin, "-http", "127.0.0.1:0", "-vllm-version", "0.33.0", "-num-blocks", "32", "-max-seq", "64",
		"-batch-rows", "1", "-log-level", "error")
	w.cmd.Env = append(os.Environ(), "TMPDIR="+w.tmp, "NIXL_LIB_DIR="+testenv.RequireNIXLLibDir(t))
	child := testenv.StartChild(t, w.cmd, false)
	w.stderr = child.Stderr
	go func() {
		sc := bufio.NewScanner(child.Stdout)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "READY ") {
				close(w.ready)
			}
		}
	}()
	return w
}

// fakeNRTDirs lists the worker's gonixl-fakenrt-* folders.
func (w *worker) fakeNRTDirs(t *testing.T) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(w.tmp, "gonixl-fakenrt-*"))
	require.NoError(t, err)
	return m
}

// stop sends SIGTERM and waits: the worker must exit 0 and leave no temporary files. A SIGTERM that arrives
// before the Go runtime has installed the worker's handler (the first milliseconds) ends it by the signal's
// default action, which is fine as long as it had made nothing yet.
func (w *worker) stop(t *testing.T) {
	t.Helper()
	require.NoError(t, w.cmd.Process.Signal(syscall.SIGTERM))
	err := w.cmd.Wait() // bounded by the command's context
	if ee, ok := err.(*exec.ExitError); ok {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGTERM && w.stderr.String() == "" {
			t.Log("SIGTERM arrived before the worker's handler: default action")
			err = nil
		}
	}
	require.NoError(t, err, "a SIGTERM is a clean stop; stderr: %s", w.stderr)
	require.Empty(t, w.fakeNRTDirs(t), "temporary files left behind")
	left, err := os.ReadDir(w.tmp)
	require.NoError(t, err)
	require.Empty(t, left, "nothing left in TMPDIR")
}

// SIGTERM at any time — while the fake libnrt is being compiled, at other points of start-up, and while
// serving — stops the worker promptly with exit status 0 and removes its temporary files.
func TestSIGTERMAnyTime(t *testing.T) {
	testenv.RequireNIXLLibDir(t)
	bin := testenv.BuildCommand(t, "prefill")

	t.Run("during the fake libnrt build", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		w := startWorker(t, ctx, bin)
		for len(w.fakeNRTDirs(t)) == 0 {
			require.NoError(t, ctx.Err(), "the worker never made its fake libnrt folder; stderr: %s", w.stderr)
			time.Sleep(time.Millisecond)
		}
		w.stop(t)
	})
	for _, after := range []time.Duration{0, 20 * time.Millisecond, 100 * time.Millisecond, 300 * time.Millisecond, time.Second} {
		t.Run("after "+after.String(), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			w := startWorker(t, ctx, bin)
			time.Sleep(after) // wherever start-up is by then: every point must stop cleanly
			w.stop(t)
		})
	}
	t.Run("while serving", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		w := startWorker(t, ctx, bin)
		select {
		case <-w.ready:
		case <-ctx.Done():
			t.Fatalf("not ready; stderr: %s", w.stderr)
		}
		require.NotEmpty(t, w.fakeNRTDirs(t), "no Trainium here: the worker runs on the fake libnrt")
		w.stop(t)
	})
}
