package testenv

import (
	"context"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"
)

// Buffer may be read while a child process writes into it (run with -race).
func TestBufferConcurrent(t *testing.T) {
	var b Buffer
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Go(func() {
			for range 1000 {
				_, _ = b.Write([]byte{byte('a' + i)})
			}
		})
	}
	for range 100 {
		_ = b.String()
	}
	wg.Wait()
	if got := len(b.String()); got != 4000 {
		t.Fatalf("wrote 4000 bytes, Buffer holds %d", got)
	}
	b.Reset()
	if b.String() != "" {
		t.Fatal("Reset left data")
	}
}

func TestBufferWithChild(t *testing.T) {
	sh, err := exec.LookPath("sh")
	if err != nil {
		Missing(t, "sh", "install a POSIX shell")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out Buffer
	cmd := exec.CommandContext(ctx, sh, "-c", "for i in 1 2 3 4 5 6 7 8 9 10; do echo line $i >&2; done")
	cmd.Stderr = &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	for range 50 {
		_ = out.String() // while the child writes
	}
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(out.String(), "line "); n != 10 {
		t.Fatalf("%d lines: %q", n, out.String())
	}
}
