package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gonixl/gonixl/internal/testenv"
	"github.com/gonixl/gonixl/neuron"
	"github.com/gonixl/gonixl/nixl"
)

func TestEnv(t *testing.T) {
	dir := nixlDir(t)
	r := runCLI(t, "env", "--nixl-lib-dir", dir, "--json")
	require.Equal(t, 0, r.code, r.stderr)
	rep := decodeJSON[envReport](t, r.stdout)
	require.True(t, rep.NIXL.Found)
	require.Equal(t, lib.Path(), rep.NIXL.Path)
	require.FileExists(t, rep.NIXL.Path)
	require.NotEmpty(t, rep.NIXL.Version, "the pinned wheel's version, read from the folder layout")
	require.DirExists(t, rep.NIXL.PluginDir)
	var ucx *pluginReport
	for i, p := range rep.NIXL.Plugins {
		if p.Name == "UCX" {
			ucx = &rep.NIXL.Plugins[i]
		}
	}
	require.NotNil(t, ucx, "plugins: %+v", rep.NIXL.Plugins)
	require.Empty(t, ucx.Error)
	require.Contains(t, ucx.MemTypes, "DRAM")
	require.Contains(t, ucx.MemTypes, "VRAM")
	require.Contains(t, ucx.Params, "num_workers")
	require.True(t, rep.ZMQ.Found)
	require.Equal(t, "ZMTP 3.1", rep.ZMQ.Version)
	// CUDA and Neuron: found, or what was tried.
	if !rep.CUDA.Found {
		require.NotEmpty(t, rep.CUDA.Error)
	} else {
		require.NotEmpty(t, rep.CUDA.DriverVersion)
		require.Len(t, rep.CUDA.Devices, rep.CUDA.DeviceCount)
	}
	if !rep.Neuron.Found {
		require.Contains(t, rep.Neuron.Error, "libnrt")
	}

	// Text: the same facts.
	r = runCLI(t, "env", "--nixl-lib-dir", dir, "--no-neuron-init")
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, lib.Path())
	require.Contains(t, r.stdout, "UCX")
	require.Contains(t, r.stdout, "ZMQ side channel")
	require.Empty(t, r.stderr)

	r = runCLI(t, "env", "--nixl-lib-dir", dir, "--require", "nixl,zmq", "--no-neuron-init")
	require.Equal(t, 0, r.code, r.stderr)
}

// TestEnvWithoutNIXL runs the binary where NIXL cannot be found: the report lists every place tried, and
// --require nixl fails in one line.
func TestEnvWithoutNIXL(t *testing.T) {
	bin := buildCLI(t)
	empty := t.TempDir()
	envv := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + empty, "NIXL_LIB_DIR=" + filepath.Join(empty, "nixl"), "LD_LIBRARY_PATH=" + empty}
	cmd := exec.Command(bin, "env", "--json", "--no-neuron-init")
	cmd.Env = envv
	out, err := cmd.Output()
	require.NoError(t, err)
	var rep envReport
	require.NoError(t, json.Unmarshal(out, &rep), string(out))
	require.False(t, rep.NIXL.Found)
	require.NotEmpty(t, rep.NIXL.Tried)
	require.Contains(t, strings.Join(rep.NIXL.Tried, "\n"), filepath.Join(empty, "nixl"), "$NIXL_LIB_DIR is tried")
	for _, p := range nixl.StandardPrefixes {
		require.Contains(t, strings.Join(rep.NIXL.Tried, "\n"), p)
	}
	require.Contains(t, rep.NIXL.Error, "make nixl")
	require.Equal(t, filepath.Join(empty, "nixl"), rep.Env["NIXL_LIB_DIR"])

	cmd = exec.Command(bin, "env", "--require", "nixl", "--no-neuron-init")
	cmd.Env = envv
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err = cmd.Output()
	var ee *exec.ExitError
	require.ErrorAs(t, err, &ee)
	require.Equal(t, exitError, ee.ExitCode())
	require.Equal(t, "gonixl env: required but not usable: nixl (see the report above for what was tried)\n", stderr.String())
	require.Contains(t, string(out), "tried ")

	// probe and bench without NIXL: probe still prints the blob's size; bench says what to do.
	cmd = exec.Command(bin, "bench", "--iters", "1")
	cmd.Env = envv
	stderr.Reset()
	cmd.Stderr = &stderr
	err = cmd.Run()
	require.ErrorAs(t, err, &ee)
	require.Equal(t, exitError, ee.ExitCode())
	require.Equal(t, 1, strings.Count(stderr.String(), "\n"), stderr.String())
	require.Contains(t, stderr.String(), "make nixl")
}

func TestProbeWithoutNIXL(t *testing.T) {
	pre, _ := startPrefill(t, "0.16.0")
	bin := buildCLI(t)
	empty := t.TempDir()
	cmd := exec.Command(bin, "probe", "tcp://127.0.0.1:"+strconv.Itoa(pre.Port()), "--vllm-version", "0.16.0", "--json", "--timeout", "5s")
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "NIXL_LIB_DIR=" + empty, "LD_LIBRARY_PATH=" + empty}
	out, err := cmd.Output()
	require.NoError(t, err)
	rep := decodeJSON[probeReport](t, string(out))
	require.Contains(t, rep.NIXL, "not loadable")
	require.Empty(t, rep.Ranks[0].Metadata.AgentName)
	require.Positive(t, rep.Ranks[0].Metadata.AgentMetadataBytes)
	require.Equal(t, pre.EngineID(), rep.Ranks[0].Metadata.EngineID)
}

// TestEnvNeuron points env at gonixl's fake libnrt (loaded through the same dlopen path as the real runtime):
// the runtime's version and NeuronCores are reported; --no-neuron-init only checks that it loads.
func TestEnvNeuron(t *testing.T) {
	lib, err := neuron.BuildFakeNRT(t.TempDir())
	if err != nil {
		testenv.Missing(t, "a C compiler for the fake libnrt", err.Error())
	}
	t.Setenv(neuron.EnvLibrary, lib)
	t.Setenv("FAKE_NRT_NUM_CORES", "4")
	t.Setenv("FAKE_NRT_VERSION", "2.31.24")
	r := runCLI(t, "env", "--json", "--no-nixl", "--require", "neuron")
	require.Equal(t, 0, r.code, r.stderr)
	rep := decodeJSON[envReport](t, r.stdout)
	require.True(t, rep.Neuron.Found, rep.Neuron.Error)
	require.Equal(t, lib, rep.Neuron.Path)
	require.Contains(t, rep.Neuron.Version, "2.31.24")
	require.Equal(t, 4, rep.Neuron.VisibleCores)
	require.Equal(t, 4, rep.Neuron.TotalCores)
	require.Equal(t, lib, rep.Env[neuron.EnvLibrary])

	r = runCLI(t, "env", "--no-nixl", "--no-neuron-init")
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "libnrt loads (runtime not initialised")
}
