// Package neurontest builds gonixl's fake libnrt: a small C library that implements the part of the Neuron
// runtime API that package neuron uses, over host memory, so that programs and tests run without
// Trainium. It has several NeuronCores, tracked allocations, the DMA alignment, granularity and
// maximum-transfer constraints, counters and fault injection, and it is loaded through the same dlopen
// path as the real runtime: pass the path Build returns as neuron.LoadOptions.Path (or $GONIXL_NRT_LIB).
// No Neuron SDK is needed, only a C compiler ($CC, else cc or gcc).
//
// The fake reads its knobs from the environment when it is loaded; Source lists them
// (FAKE_NRT_NUM_CORES, FAKE_NRT_DEVICE_BYTES, FAKE_NRT_MAX_XFER, FAKE_NRT_FAIL_READ, FAKE_NRT_VERSION, ...).
package neurontest

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
)

//go:embed internal/fakenrt/fakenrt.c
var source []byte

// Source returns the C source of the fake libnrt.
func Source() []byte { return append([]byte(nil), source...) }

// Build compiles the fake libnrt into dir/libnrt.so.1 (creating dir) and returns its path.
func Build(dir string) (string, error) { return build(context.Background(), dir, false) }

// BuildContext is Build that stops the compiler when ctx ends (a worker asked to stop during its start-up),
// returning ctx's error.
func BuildContext(ctx context.Context, dir string) (string, error) { return build(ctx, dir, false) }

// BuildOldRuntime is Build for a runtime older than the optional symbols package neuron can do without
// (the batch tensor transfers, nrt_get_status_as_str): it tests the fallbacks.
func BuildOldRuntime(dir string) (string, error) { return build(context.Background(), dir, true) }

func build(ctx context.Context, dir string, oldRuntime bool) (string, error) {
	if dir == "" {
		return "", errors.New("neurontest: Build needs a folder to build the fake libnrt in")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("neurontest: fake libnrt folder: %w", err)
	}
	cc, err := findCC()
	if err != nil {
		return "", err
	}
	src := filepath.Join(dir, "fakenrt.c")
	if err := os.WriteFile(src, source, 0o644); err != nil {
		return "", fmt.Errorf("neurontest: write fake libnrt source: %w", err)
	}
	out := filepath.Join(dir, "libnrt.so.1")
	args := []string{"-O2", "-shared", "-fPIC", "-Wl,-Bsymbolic", "-o", out, src, "-lpthread"}
	if oldRuntime {
		args = append([]string{"-DFAKE_NRT_OLD_RUNTIME"}, args...)
	}
	cmd := exec.CommandContext(ctx, cc, args...)
	// The compiler's scratch files go to dir too, and when ctx ends its whole process group (driver, cc1, as,
	// ld) is killed: a stopped build leaves nothing outside dir, and nothing writes into dir afterwards.
	cmd.Env = append(os.Environ(), "TMPDIR="+dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	if b, err := cmd.CombinedOutput(); err != nil {
		if ctx.Err() != nil {
			return "", fmt.Errorf("neurontest: build fake libnrt: %w", ctx.Err())
		}
		return "", fmt.Errorf("neurontest: build fake libnrt with %s: %w: %s", cc, err, strings.TrimSpace(string(b)))
	}
	return out, nil
}

func findCC() (string, error) {
	names := []string{"cc", "gcc"}
	if env := os.Getenv("CC"); env != "" {
		names = append([]string{strings.Fields(env)[0]}, names...)
	}
	for _, n := range names {
		if p, err := exec.LookPath(n); err == nil {
			return p, nil
		}
	}
	return "", errors.New("neurontest: no C compiler (cc or gcc) found to build the fake libnrt; install gcc or set CC")
}
