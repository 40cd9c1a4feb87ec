package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gonixl/gonixl/internal/testenv"
)

func TestBenchLocal(t *testing.T) {
	dir := nixlDir(t)
	r := runCLI(t, "bench", "--nixl-lib-dir", dir, "--block-sizes", "4KiB,64KiB", "--batch", "1,4", "--iters", "5",
		"--warmup", "1", "--progress", "on", "--json")
	require.Equal(t, 0, r.code, r.stderr)
	rep := decodeJSON[benchReport](t, r.stdout)
	require.Equal(t, "local", rep.Mode)
	require.True(t, rep.Verified)
	require.NotEqual(t, rep.Initiator, rep.Target)
	require.Len(t, rep.Rows, 2*2*2)
	i := 0
	for _, op := range []string{"READ", "WRITE"} {
		for _, batch := range []int{1, 4} {
			for _, bs := range []int64{4 << 10, 64 << 10} {
				row := rep.Rows[i]
				i++
				require.Equal(t, op, row.Op)
				require.Equal(t, batch, row.Batch)
				require.Equal(t, bs, row.BlockSize)
				require.Equal(t, bs*int64(batch), row.Bytes)
				require.Equal(t, 5, row.Iters)
				require.Positive(t, row.GBps)
				require.Positive(t, row.MinLatUs)
				require.LessOrEqual(t, row.MinLatUs, row.AvgLatUs)
				require.LessOrEqual(t, row.AvgLatUs, row.P99LatUs, "with 5 posts the p99 is the slowest")
				// GB/s is bytes over the mean latency.
				require.InEpsilon(t, float64(row.Bytes)/row.AvgLatUs/1e3, row.GBps, 1e-6)
			}
		}
	}
	require.Contains(t, r.stderr, "READ  block 64KiB", "the progress line")

	// The table.
	r = runCLI(t, "bench", "--nixl-lib-dir", dir, "--block-sizes", "4KiB", "--batch", "2", "--iters", "3", "--op", "WRITE")
	require.Equal(t, 0, r.code, r.stderr)
	require.Empty(t, r.stderr, "no progress line when stderr is no terminal")
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	require.Len(t, lines, 3, r.stdout)
	require.Contains(t, lines[0], "data path verified: true")
	require.Equal(t, []string{"op", "block", "size", "batch", "iters", "GB/s", "avg", "lat", "(us)", "p99", "lat", "(us)"}, strings.Fields(lines[1]))
	require.Equal(t, []string{"WRITE", "4KiB", "2", "3"}, strings.Fields(lines[2])[:4])
}

func TestBenchBadFlags(t *testing.T) {
	requireOneLine(t, runCLI(t, "bench", "--op", "COPY"), exitUsage, "--op")
	requireOneLine(t, runCLI(t, "bench", "--min-block", "1MiB", "--max-block", "4KiB"), exitUsage, "larger than")
	requireOneLine(t, runCLI(t, "bench", "--block-sizes", "4x"), exitUsage, "bad size")
	requireOneLine(t, runCLI(t, "bench", "--batch", "0"), exitUsage, "--batch")
	requireOneLine(t, runCLI(t, "bench", "--max-block", "1GiB", "--batch", "64"), exitUsage, "--max-mem")
	requireOneLine(t, runCLI(t, "bench", "--serve", "--peer", "x:1"), exitUsage, "exclude")
}

// startServer runs `gonixl bench --serve` as its own process and returns its address.
func startServer(t *testing.T, dir string, extra ...string) (addr string, cmd *exec.Cmd, stdout *bufio.Reader, stderr *testenv.Buffer) {
	t.Helper()
	bin := buildCLI(t)
	cmd = exec.Command(bin, append([]string{"bench", "--serve", "--listen", "127.0.0.1:0", "--nixl-lib-dir", dir}, extra...)...)
	child := testenv.StartChild(t, cmd, false)
	stdout, stderr = child.Stdout, child.Stderr
	lineCh := make(chan string, 1)
	go func() {
		line, _ := stdout.ReadString('\n')
		lineCh <- line
	}()
	var line string
	select {
	case line = <-lineCh:
	case <-time.After(20 * time.Second):
		t.Fatalf("the bench server did not start; stderr: %s", stderr.String())
	}
	_, err := fmt.Sscanf(line, "gonixl bench: serving on %s", &addr)
	require.NoError(t, err, "first line: %q, stderr: %s", line, stderr.String())
	return addr, cmd, stdout, stderr
}

func TestBenchRemote(t *testing.T) {
	dir := nixlDir(t)
	addr, cmd, stdout, stderr := startServer(t, dir)

	// Garbage and a client that goes away do not stop the server.
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	_, err = c.Write([]byte("GET / HTTP/1.0\r\n\r\n"))
	require.NoError(t, err)
	_, _ = io.ReadAll(c) // the server closes it
	c.Close()

	// An initiator in this process against the server process.
	r := runCLI(t, "bench", "--peer", addr, "--nixl-lib-dir", dir, "--block-sizes", "4KiB,1MiB", "--batch", "1,2", "--iters", "4",
		"--warmup", "1", "--op", "READ,WRITE", "--json")
	require.Equal(t, 0, r.code, "%s; server: %s", r.stderr, stderr.String())
	rep := decodeJSON[benchReport](t, r.stdout)
	require.Equal(t, "remote", rep.Mode)
	require.True(t, rep.Verified, "READ of the server's pattern and WRITE read back")
	require.True(t, strings.HasPrefix(rep.Target, "gonixl-bench-serve-"), rep.Target)
	require.Len(t, rep.Rows, 8)
	for _, row := range rep.Rows {
		require.Positive(t, row.GBps)
		require.Equal(t, 4, row.Iters)
	}

	// A request above the server's --max-mem is refused in one line; the server goes on.
	// (The server allows 4 GiB by default; ask the client to allow more than that.)
	r = runCLI(t, "bench", "--peer", addr, "--nixl-lib-dir", dir, "--block-sizes", "1GiB", "--batch", "5", "--max-mem", "8GiB", "--iters", "1")
	requireOneLine(t, r, exitError, "refused", "--max-mem")

	// A second run works too, then SIGINT stops the server cleanly.
	r = runCLI(t, "bench", "--peer", addr, "--nixl-lib-dir", dir, "--block-sizes", "4KiB", "--batch", "1", "--iters", "2", "--op", "READ")
	require.Equal(t, 0, r.code, r.stderr)
	require.NoError(t, cmd.Process.Signal(syscall.SIGINT))
	rest, _ := io.ReadAll(stdout)
	require.NoError(t, cmd.Wait(), "server stderr: %s", stderr.String())
	require.Equal(t, 2, strings.Count(string(rest), " done\n"), string(rest))
	// One line per bad initiator (the HTTP request, the oversized one).
	require.Contains(t, stderr.String(), "not a gonixl bench message")
	require.Contains(t, stderr.String(), "this server allows")
	require.Equal(t, 2, strings.Count(stderr.String(), "\n"), stderr.String())
}

func TestBenchPeerErrors(t *testing.T) {
	dir := nixlDir(t)
	// Nobody listening.
	addr := testenv.RefusedAddr(t)
	requireOneLine(t, runCLI(t, "bench", "--peer", addr, "--nixl-lib-dir", dir, "--timeout", "1s"), exitError, "connecting to the bench server")

	// Something that is not a bench server: garbage, then silence.
	for _, reply := range []string{"SSH-2.0-OpenSSH_9.6\r\n", ""} {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		done := make(chan struct{})
		go func() {
			defer close(done)
			c, err := l.Accept()
			if err != nil {
				return
			}
			defer c.Close()
			_, _ = c.Write([]byte(reply))
			_, _ = io.Copy(io.Discard, c)
		}()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		r := runCLICtx(t, ctx, "bench", "--peer", l.Addr().String(), "--nixl-lib-dir", dir, "--timeout", "500ms")
		cancel()
		requireOneLine(t, r, exitError, "no welcome")
		l.Close()
		<-done
	}
}

func TestSubprocessSmoke(t *testing.T) {
	// The built binary: help, an error line and the exit statuses as a shell sees them.
	bin := buildCLI(t)
	out, err := exec.Command(bin, "help").Output()
	require.NoError(t, err)
	require.Contains(t, string(out), "Commands:")
	cmd := exec.Command(bin, "inspect", "/definitely/not/here")
	var stderr testenv.Buffer
	cmd.Stderr = &stderr
	err = cmd.Run()
	var ee *exec.ExitError
	require.ErrorAs(t, err, &ee)
	require.Equal(t, exitError, ee.ExitCode())
	require.Equal(t, 1, strings.Count(stderr.String(), "\n"), stderr.String())
	require.True(t, strings.HasPrefix(stderr.String(), "gonixl inspect: "), stderr.String())
}

// FuzzBenchControl feeds arbitrary lines to the bench's control-message decoding (both directions): never a
// panic, and nothing accepted that asks for more memory than allowed or names no buffer.
func FuzzBenchControl(f *testing.F) {
	f.Add([]byte(`{"gonixl_bench": 1, "bytes": 4096, "agent": "a", "metadata": "AAEC"}` + "\n"))
	f.Add([]byte(`{"gonixl_bench": 1, "agent": "t", "metadata": "AAEC", "addr": 140000000000, "len": 8192, "seed": 3}` + "\n"))
	f.Add([]byte(`{"gonixl_bench": 1, "error": "no"}` + "\n"))
	f.Add([]byte(`{"gonixl_bench": 1, "bytes": -1}` + "\n"))
	f.Add([]byte("GET / HTTP/1.0\r\n\r\n"))
	f.Add([]byte(`{"done": true}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		const maxMem, size = 1 << 20, 4096
		var h benchHello
		if readLine(bufio.NewReader(bytes.NewReader(b)), &h) == nil && h.check(maxMem) == nil {
			require.Positive(t, h.Bytes)
			require.LessOrEqual(t, h.Bytes, int64(maxMem))
			require.NotEmpty(t, h.Metadata)
		}
		var w benchWelcome
		if readLine(bufio.NewReader(bytes.NewReader(b)), &w) == nil && w.check(size) == nil {
			require.Empty(t, w.Error)
			require.NotZero(t, w.Addr)
			require.GreaterOrEqual(t, w.Len, uint64(size))
		}
	})
}
