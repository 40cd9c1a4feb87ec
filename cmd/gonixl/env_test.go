package main

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gonixl/gonixl/internal/testenv"
	"github.com/gonixl/gonixl/neuron"
	"github.com/gonixl/gonixl/neuron/neurontest"
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
	for _, p := range nixl.StandardPaths {
		require.Contains(t, strings.Join(rep.NIXL.Tried, "\n"), p)
	}
	require.Contains(t, rep.NIXL.Error, "make nixl")
	require.Equal(t, filepath.Join(empty, "nixl"), rep.Env["NIXL_LIB_DIR"])

	cmd = exec.Command(bin, "env", "--require", "nixl", "--no-neuron-init")
	cmd.Env = envv
	var stderr testenv.Buffer
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
	lib, err := neurontest.Build(t.TempDir())
	if err != nil {
		testenv.Missing(t, "a C compiler for the fake libnrt", err.Error())
	}
	t.Setenv(neuron.EnvLibPath, lib)
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
	require.Equal(t, lib, rep.Env[neuron.EnvLibPath])

	r = runCLI(t, "env", "--no-nixl", "--no-neuron-init")
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "libnrt loads (runtime not initialised")
	require.Contains(t, r.stdout, "NIXL\n  skipped (--no-nixl)\n", "skipped, not \"not loaded\"")
}

// TestEnvPluginMissing runs env where the LIBFABRIC plugin's libfabric.so.1 is too old: a stand-in built here
// that defines only the symbol versions FABRIC_1.0 and FABRIC_1.1 (older than the FABRIC_1.7 NIXL 1.5.0's plugin needs),
// first on LD_LIBRARY_PATH. The report names that version need, not only the first missing library, and every
// other library of the plugin that cannot be found.
func TestEnvPluginMissing(t *testing.T) {
	dir := nixlDir(t)
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		testenv.Missing(t, "gcc (builds a stand-in libfabric.so.1)", err.Error())
	}
	fake := t.TempDir()
	src := filepath.Join(fake, "fab.c")
	vmap := filepath.Join(fake, "fab.map")
	require.NoError(t, os.WriteFile(src, []byte("int fi_getinfo(void){return -1;}\nint fi_freeinfo(void){return 0;}\n"+
		"int fi_dupinfo(void){return 0;}\nint fi_fabric(void){return -1;}\nconst char *fi_strerror(int e){return \"x\";}\n"), 0o644))
	require.NoError(t, os.WriteFile(vmap, []byte("FABRIC_1.0 { global: fi_getinfo; fi_freeinfo; fi_dupinfo; fi_fabric; fi_strerror; local: *; };\n"+
		"FABRIC_1.1 { global: fi_getinfo; fi_freeinfo; fi_dupinfo; fi_fabric; } FABRIC_1.0;\n"), 0o644))
	out, err := exec.Command(gcc, "-shared", "-fPIC", "-o", filepath.Join(fake, "libfabric.so.1"), src,
		"-Wl,-soname,libfabric.so.1", "-Wl,--version-script="+vmap).CombinedOutput()
	require.NoError(t, err, "%s", out)

	bin := buildCLI(t)
	cmd := exec.Command(bin, "env", "--json", "--no-neuron-init", "--nixl-lib-dir", dir)
	cmd.Env = append(os.Environ(), "LD_LIBRARY_PATH="+fake+string(os.PathListSeparator)+os.Getenv("LD_LIBRARY_PATH"),
		"FI_PROVIDER=tcp", "NIXL_LIBFABRIC_NUM_THREADS=2", nixl.EnvDepDirs+"=") // no preloaded libfabric
	stdout, err := cmd.Output()
	require.NoError(t, err)
	rep := decodeJSON[envReport](t, string(stdout))
	require.Equal(t, "tcp", rep.Env["FI_PROVIDER"])
	require.Equal(t, "2", rep.Env["NIXL_LIBFABRIC_NUM_THREADS"], "NIXL_LIBFABRIC_* parameter overrides are reported")
	var lf *pluginReport
	for i, p := range rep.NIXL.Plugins {
		if p.Name == "LIBFABRIC" {
			lf = &rep.NIXL.Plugins[i]
		}
		if p.Name == "UCX" {
			require.True(t, p.Loads, p.Error)
			require.Empty(t, p.Missing)
		}
	}
	require.NotNil(t, lf, "plugins: %+v", rep.NIXL.Plugins)
	require.False(t, lf.Loads)
	require.Equal(t, filepath.Join(rep.NIXL.PluginDir, "libplugin_LIBFABRIC.so"), lf.File)
	// NIXL 1.5.0's plugin needs FABRIC_1.7 (1.5.1's FABRIC_1.10).
	require.Contains(t, lf.Missing, "libfabric.so.1: version FABRIC_1.7 not found in "+filepath.Join(fake, "libfabric.so.1")+
		" (it defines up to FABRIC_1.1; needed by libplugin_LIBFABRIC.so)")
	require.Contains(t, lf.Error, "FABRIC_1.7")
	// The plugin's other libraries: each one the loader cannot find here is named too.
	for _, lib := range []string{"libhwloc.so.15", "libcuda.so.1"} {
		if !loaderFinds(lib) {
			require.Contains(t, lf.Missing, lib+": not found (needed by libplugin_LIBFABRIC.so)")
		}
	}

	// Text: the plugin's name, then one line per problem.
	cmd = exec.Command(bin, "env", "--no-neuron-init", "--nixl-lib-dir", dir)
	cmd.Env = append(os.Environ(), "LD_LIBRARY_PATH="+fake+string(os.PathListSeparator)+os.Getenv("LD_LIBRARY_PATH"), nixl.EnvDepDirs+"=")
	stdout, err = cmd.Output()
	require.NoError(t, err)
	require.Regexp(t, `LIBFABRIC\s+cannot be loaded here; missing:\n(\s+.*\n)*?\s+libfabric.so.1: version FABRIC_1.7 not found`, string(stdout))
}

// loaderFinds reports whether the dynamic loader's cache or LD_LIBRARY_PATH has lib.
func loaderFinds(lib string) bool {
	for _, d := range filepath.SplitList(os.Getenv("LD_LIBRARY_PATH")) {
		if _, err := os.Stat(filepath.Join(d, lib)); err == nil {
			return true
		}
	}
	out, err := exec.Command("/sbin/ldconfig", "-p").Output()
	return err == nil && strings.Contains(string(out), lib+" ")
}

// pluginProblems: a plugin whose libraries all resolve keeps NIXL's own error; an unreadable file says so.
func TestPluginProblems(t *testing.T) {
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		testenv.Missing(t, "gcc (builds a stand-in plugin)", err.Error())
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "p.c")
	require.NoError(t, os.WriteFile(src, []byte("int nixl_plugin_init(void){return 0;}\n"), 0o644))
	plugin := filepath.Join(dir, "libplugin_FAKE.so")
	out, err := exec.Command(gcc, "-shared", "-fPIC", "-o", plugin, src).CombinedOutput()
	require.NoError(t, err, "%s", out)
	nixlErr := errors.New("nixl: plugin params FAKE: ERR_BACKEND")

	missing, msg := pluginProblems(plugin, nixlErr)
	require.Empty(t, missing)
	require.Equal(t, "its libraries are all found, but NIXL cannot load it: nixl: plugin params FAKE: ERR_BACKEND", msg)

	notELF := filepath.Join(dir, "libplugin_TEXT.so")
	require.NoError(t, os.WriteFile(notELF, []byte("text"), 0o644))
	missing, msg = pluginProblems(notELF, nixlErr)
	require.Empty(t, missing)
	require.Contains(t, msg, "cannot be loaded here: nixl: plugin params FAKE: ERR_BACKEND (reading "+notELF+": elfdeps: not an ELF file")
}

// TestEnvLIBFABRIC: with $GONIXL_NIXL_DEPS naming `make fabric-deps`'s folder, `gonixl env` preloads it and
// reports LIBFABRIC loadable, each library it needs from outside NIXL resolved into that folder, and what it
// needs from the environment; given an empty folder instead, it names every library the plugin lacks.
func TestEnvLIBFABRIC(t *testing.T) {
	dir := nixlDir(t)
	deps := os.Getenv(nixl.EnvDepDirs)
	if _, err := os.Stat(filepath.Join(deps, "libfabric.so.1")); deps == "" || err != nil {
		testenv.Missing(t, "the LIBFABRIC plugin's libraries ($"+nixl.EnvDepDirs+")", "run `make fabric-deps` (the Makefile exports "+nixl.EnvDepDirs+")")
	}
	bin := buildCLI(t)
	run := func(depsEnv string, args ...string) envReport {
		cmd := exec.Command(bin, append([]string{"env", "--json", "--no-neuron-init", "--nixl-lib-dir", dir}, args...)...)
		cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir(), nixl.EnvDepDirs + "=" + depsEnv, "FI_PROVIDER=tcp"}
		out, err := cmd.Output()
		require.NoError(t, err, testenv.ExitStderr(err))
		var rep envReport
		require.NoError(t, json.Unmarshal(out, &rep), string(out))
		return rep
	}
	fabric := func(rep envReport) pluginReport {
		for _, p := range rep.NIXL.Plugins {
			if p.Name == "LIBFABRIC" {
				return p
			}
		}
		t.Fatalf("no LIBFABRIC plugin in %+v", rep.NIXL.Plugins)
		return pluginReport{}
	}

	rep := run(deps)
	require.Equal(t, []string{filepath.Clean(deps)}, rep.NIXL.DepDirs)
	for _, d := range rep.NIXL.Deps {
		require.Empty(t, d.Err, d.Path)
	}
	p := fabric(rep)
	require.True(t, p.Loads, "%+v", p)
	require.Contains(t, p.MemTypes, "DRAM")
	for _, lib := range []string{"libfabric.so.1", "libhwloc.so.15"} {
		require.Equal(t, filepath.Join(filepath.Clean(deps), lib), p.Needs[lib], "%+v", p.Needs)
	}
	require.Contains(t, strings.Join(p.Requires, "\n"), "set: FI_PROVIDER=tcp")

	rep = run("", "--nixl-deps", t.TempDir())
	require.Empty(t, rep.NIXL.Deps)
	p = fabric(rep)
	require.False(t, p.Loads)
	require.Contains(t, strings.Join(p.Missing, "\n"), "libfabric.so.1")
	require.Contains(t, p.Needs, "libfabric.so.1")
	require.Empty(t, p.Needs["libfabric.so.1"])
}
