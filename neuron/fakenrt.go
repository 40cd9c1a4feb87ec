package neuron

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
var fakeNRTSource []byte

// FakeNRTSource returns the C source of the fake libnrt (see BuildFakeNRT).
func FakeNRTSource() []byte { return append([]byte(nil), fakeNRTSource...) }

// BuildFakeNRT compiles the fake libnrt — a small C library implementing the part of the libnrt API this
// package uses over host memory, with NeuronCores, tracked allocations, DMA constraints, counters and fault
// injection — into dir/libnrt.so.1 with the system C compiler ($CC, else cc or gcc) and returns its path.
// Pass the path as Options.Path (or $GONIXL_NRT_LIB) to run without Trainium; it is loaded through the
// same dlopen path as the real runtime. No Neuron SDK is needed. The knobs are described in the source
// (FakeNRTSource): FAKE_NRT_NUM_CORES, FAKE_NRT_DEVICE_BYTES, FAKE_NRT_MAX_XFER, FAKE_NRT_FAIL_READ, ...
func BuildFakeNRT(dir string) (string, error) { return buildFakeNRT(context.Background(), dir, false) }

// BuildFakeNRTContext is BuildFakeNRT that stops the compiler when ctx ends (a worker asked to stop during
// its start-up), returning ctx's error.
func BuildFakeNRTContext(ctx context.Context, dir string) (string, error) {
	return buildFakeNRT(ctx, dir, false)
}

// buildFakeNRT optionally builds the "old runtime" variant without the optional symbols (batch transfers,
// nrt_get_status_as_str).
func buildFakeNRT(ctx context.Context, dir string, oldRuntime bool) (string, error) {
	if dir == "" {
		return "", fmt.Errorf("%w: BuildFakeNRT needs a folder", ErrBadArgument)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("neuron: fake libnrt folder: %w", err)
	}
	cc, err := findCC()
	if err != nil {
		return "", err
	}
	src := filepath.Join(dir, "fakenrt.c")
	if err := os.WriteFile(src, fakeNRTSource, 0o644); err != nil {
		return "", fmt.Errorf("neuron: write fake libnrt source: %w", err)
	}
	out := filepath.Join(dir, "libnrt.so.1")
	args := []string{"-O2", "-shared", "-fPIC", "-Wl,-Bsymbolic", "-o", out, src, "-lpthread"}
	if oldRuntime {
		args = append([]string{"-DFAKE_NRT_OLD_RUNTIME"}, args...)
	}
	cmd := exec.CommandContext(ctx, cc, args...)
	// The compiler's scratch files go to dir too, and when ctx ends its whole process group (driver, cc1,
	// as, ld) is killed: a stopped build leaves nothing outside dir, and nothing writes into dir afterwards.
	cmd.Env = append(os.Environ(), "TMPDIR="+dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	if b, err := cmd.CombinedOutput(); err != nil {
		if ctx.Err() != nil {
			return "", fmt.Errorf("neuron: build fake libnrt: %w", ctx.Err())
		}
		return "", fmt.Errorf("neuron: build fake libnrt with %s: %w: %s", cc, err, strings.TrimSpace(string(b)))
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
	return "", errors.New("neuron: no C compiler (cc or gcc) found to build the fake libnrt; install gcc or set CC")
}
