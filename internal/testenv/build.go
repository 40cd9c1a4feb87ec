package testenv

import (
	"context"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// BuildCommand builds the command in the working directory (the test's package) into the test's temporary
// folder as name and returns the binary's path: for tests that drive the real program end to end, as a
// separate process.
func BuildCommand(tb testing.TB, name string) string {
	tb.Helper()
	bin := filepath.Join(tb.TempDir(), name)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		tb.Fatalf("go build: %v: %s", err, out)
	}
	return bin
}
