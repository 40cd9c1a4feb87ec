package main

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/gonixl/gonixl/connector"
	"github.com/gonixl/gonixl/connector/protocol"
	"github.com/gonixl/gonixl/internal/testenv"
	"github.com/gonixl/gonixl/layout"
	"github.com/gonixl/gonixl/nixl"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// result is one in-process run of the CLI.
type result struct {
	code           int
	stdout, stderr string
}

func runCLI(t *testing.T, args ...string) result {
	t.Helper()
	return runCLICtx(t, context.Background(), args...)
}

func runCLICtx(t *testing.T, ctx context.Context, args ...string) result {
	t.Helper()
	var out, errb testenv.Buffer // a command's goroutines (progress lines) may still write as it returns
	code := runContext(ctx, args, &out, &errb)
	return result{code: code, stdout: out.String(), stderr: errb.String()}
}

// requireOneLine asserts a failure that says why in exactly one stderr line (and no stack trace).
func requireOneLine(t *testing.T, r result, wantCode int, contains ...string) {
	t.Helper()
	require.Equal(t, wantCode, r.code, "stdout: %s\nstderr: %s", r.stdout, r.stderr)
	msg := strings.TrimSuffix(r.stderr, "\n")
	require.NotEmpty(t, msg)
	require.NotContains(t, msg, "\n", "want one line on stderr, got: %q", r.stderr)
	require.NotContains(t, msg, "goroutine ")
	require.NotContains(t, msg, "panic")
	for _, c := range contains {
		require.Contains(t, msg, c)
	}
}

func decodeJSON[T any](t *testing.T, s string) T {
	t.Helper()
	var v T
	require.NoError(t, json.Unmarshal([]byte(s), &v), "output: %s", s)
	return v
}

var (
	libOnce sync.Once
	lib     *nixl.Library
	libErr  error
)

// nixlDir returns the NIXL library folder (failing under CI=true, skipping elsewhere when absent) and loads
// NIXL into the test process.
func nixlDir(t *testing.T) string {
	t.Helper()
	dir := testenv.RequireNIXLLibDir(t)
	libOnce.Do(func() {
		nf := nixlFlags{libDir: dir}
		lib, libErr = nf.load()
	})
	require.NoError(t, libErr)
	return dir
}

// testModel is a small model shape for the prefill servers of the tests.
var testModel = protocol.CompatInputs{Model: "test/tiny", Dtype: "torch.bfloat16", NumKVHeads: 2, HeadSize: 16,
	NumHiddenLayers: 2, AttnBackendName: "FLASH_ATTN", CacheDtype: "auto"}

// startPrefill starts the repo's prefill role (a DRAM cache on a small geometry) for vLLM version v.
func startPrefill(t *testing.T, v string) (*connector.Prefill, *connector.DRAMCache) {
	t.Helper()
	nixlDir(t)
	p, err := protocol.ProfileFor(v)
	require.NoError(t, err)
	m := connector.Model{Layers: int(testModel.NumHiddenLayers), KVHeads: int(testModel.NumKVHeads),
		HeadDim: int(testModel.HeadSize), DType: layout.BF16}
	g, err := m.Geometry(p, 9, 1) // block size 16, HND, the profile's region plan
	require.NoError(t, err)
	cache, err := connector.NewDRAMCache(g, false)
	require.NoError(t, err)
	in := testModel
	in.VLLMVersion = v
	pre, err := connector.NewPrefill(connector.PrefillConfig{RoleConfig: connector.RoleConfig{Profile: p, Library: lib, Cache: cache, EngineID: "engine-" + p.Name, Compat: connector.Compat{CompatInputs: in}}})
	require.NoError(t, err)
	t.Cleanup(func() {
		require.NoError(t, pre.Close())
		require.NoError(t, cache.Close())
	})
	return pre, cache
}

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
	buildOut  []byte
)

// buildCLI builds the gonixl binary once per test run.
func buildCLI(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "gonixl-cli-")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "gonixl")
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "go", "build", "-o", binPath, ".")
		buildOut, buildErr = cmd.CombinedOutput()
	})
	require.NoError(t, buildErr, "go build: %s", buildOut)
	return binPath
}

func TestHelp(t *testing.T) {
	r := runCLI(t, "help")
	require.Equal(t, 0, r.code)
	for _, c := range commands {
		require.Contains(t, r.stdout, "  "+c.name+" ")
	}
	for _, c := range commands {
		r := runCLI(t, c.name, "-h")
		require.Equal(t, 0, r.code, c.name)
		require.True(t, strings.HasPrefix(r.stdout, "Usage: gonixl "+c.name+" "), r.stdout)
		require.Contains(t, r.stdout, "\nFlags:\n")
		require.Empty(t, r.stderr)
		require.Equal(t, r.stdout, runCLI(t, "help", c.name).stdout)
	}
	r = runCLI(t)
	require.Equal(t, exitUsage, r.code)
	require.Contains(t, r.stderr, "Commands:")
}

func TestBadCommandLine(t *testing.T) {
	requireOneLine(t, runCLI(t, "frobnicate"), exitUsage, `unknown command "frobnicate"`)
	requireOneLine(t, runCLI(t, "help", "frobnicate"), exitUsage, `unknown command "frobnicate"`)
	for _, c := range commands {
		r := runCLI(t, c.name, "--no-such-flag")
		requireOneLine(t, r, exitUsage, "no-such-flag", "gonixl "+c.name+" -h")
		require.Empty(t, r.stdout, "no help text on a bad flag")
	}
	requireOneLine(t, runCLI(t, "env", "--require", "gpu"), exitUsage, `unknown component "gpu"`)
	requireOneLine(t, runCLI(t, "probe", "--vllm-version", "0.16.0"), exitUsage, "one address")
	requireOneLine(t, runCLI(t, "probe", "127.0.0.1:1"), exitUsage, "--vllm-version is required")
	requireOneLine(t, runCLI(t, "probe", "127.0.0.1:1", "--vllm-version", "0.99.0"), exitError, "no profile")
	requireOneLine(t, runCLI(t, "probe", "127.0.0.1:1", "--vllm-version", "0.16.0", "--rank", "a,b"), exitUsage, "pp,tp")
	requireOneLine(t, runCLI(t, "probe", "127.0.0.1:1", "--vllm-version", "0.16.0", "--model", "m"), exitUsage, "--kv-heads")
}

func TestOneLine(t *testing.T) {
	require.Equal(t, "a; b; c", oneLine("a\n  - b\n\nc\n"))
	require.Equal(t, "x", oneLine("x"))
}
