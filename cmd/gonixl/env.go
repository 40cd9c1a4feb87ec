package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/gonixl/gonixl/connector/sidechannel"
	"github.com/gonixl/gonixl/cuda"
	"github.com/gonixl/gonixl/internal/dl"
	"github.com/gonixl/gonixl/internal/elfdeps"
	"github.com/gonixl/gonixl/neuron"
	"github.com/gonixl/gonixl/nixl"
)

// envReport is what `gonixl env` finds (its --json form).
type envReport struct {
	NIXL   nixlReport        `json:"nixl"`
	ZMQ    zmqReport         `json:"zmq"`
	CUDA   cudaReport        `json:"cuda"`
	Neuron neuronReport      `json:"neuron"`
	Env    map[string]string `json:"environment"`
}

// libReport is what each library's section has: whether it loaded and from where, or each place tried (with
// why it failed) and what to do.
type libReport struct {
	Found bool     `json:"found"`
	Path  string   `json:"path,omitempty"`
	Tried []string `json:"tried,omitempty"`
	Error string   `json:"error,omitempty"`
}

// failed records a load error: for a LoadError (the one shape of nixl, cuda and neuron) every candidate with
// why it failed, and fix as the error; for any other error its text.
func (r *libReport) failed(err error, fix string) {
	var le *dl.LoadError
	if !errors.As(err, &le) {
		r.Error = oneLine(err.Error())
		return
	}
	for i, t := range le.Tried {
		if i < len(le.Why) && le.Why[i] != "" {
			t += ": " + le.Why[i]
		}
		r.Tried = append(r.Tried, t)
	}
	r.Error = fix
}

// writeNotLoaded writes the section of a library that did not load.
func (r *libReport) writeNotLoaded(w io.Writer) {
	fmt.Fprintf(w, "  not loaded: %s\n", r.Error)
	for _, t := range r.Tried {
		fmt.Fprintf(w, "    tried %s\n", t)
	}
}

type nixlReport struct {
	libReport
	Version         string `json:"version,omitempty"`
	PluginDir       string `json:"plugin_dir,omitempty"`
	HasCustomParams bool   `json:"has_custom_params,omitempty"`
	// DepDirs are the plugin-dependency folders nixl.Load preloaded from (LoadOptions.DepDirs, $GONIXL_NIXL_DEPS)
	// and Deps each library it loaded from them, or failed to.
	DepDirs []string       `json:"dep_dirs,omitempty"`
	Deps    []nixl.Dep     `json:"deps,omitempty"`
	Plugins []pluginReport `json:"plugins,omitempty"`
}

type pluginReport struct {
	Name  string `json:"name"`
	Loads bool   `json:"loads"`
	// File is the plugin's shared object (libplugin_<name>.so in the plugin folder).
	File     string            `json:"file,omitempty"`
	MemTypes []string          `json:"mem_types,omitempty"`
	Params   map[string]string `json:"params,omitempty"`
	// Missing lists, when the plugin does not load, every library, symbol version or symbol the dynamic
	// loader would not find for it (from its ELF dependency closure; internal/elfdeps).
	Missing []string `json:"missing,omitempty"`
	// Needs (LIBFABRIC only) maps each library the plugin needs from outside NIXL (libfabric, hwloc, the CUDA
	// runtime and driver) to the file it resolves to ("" when not found), and Requires says what else it
	// needs from the environment and what is set.
	Needs    map[string]string `json:"needs,omitempty"`
	Requires []string          `json:"requires,omitempty"`
	Error    string            `json:"error,omitempty"`
}

type zmqReport struct {
	Found   bool   `json:"found"`
	Version string `json:"version"`
}

type cudaReport struct {
	libReport
	DriverVersion string       `json:"driver_version,omitempty"`
	DeviceCount   int          `json:"device_count"`
	Devices       []cudaDevice `json:"devices,omitempty"`
}

type cudaDevice struct {
	Ordinal  int    `json:"ordinal"`
	Name     string `json:"name,omitempty"`
	UUID     string `json:"uuid,omitempty"`
	PCIBusID string `json:"pci_bus_id,omitempty"`
	Compute  string `json:"compute_capability,omitempty"`
	TotalMem uint64 `json:"total_mem_bytes,omitempty"`
	FreeMem  uint64 `json:"free_mem_bytes,omitempty"`
	Error    string `json:"error,omitempty"`
}

type neuronReport struct {
	libReport
	Version      string `json:"version,omitempty"`
	VisibleCores int    `json:"visible_cores,omitempty"`
	TotalCores   int    `json:"total_cores,omitempty"`
}

// envVars are the environment variables that steer where the libraries are found and how they behave.
var envVars = []string{
	"NIXL_LIB_DIR", "NIXL_PLUGIN_DIR", "LD_LIBRARY_PATH", "UCX_TLS", "UCX_NET_DEVICES",
	"GONIXL_CUDA_LIB", "CUDA_VISIBLE_DEVICES", "GONIXL_NRT_LIB", "NEURON_RT_VISIBLE_CORES",
	"VLLM_NIXL_SIDE_CHANNEL_HOST", "VLLM_NIXL_SIDE_CHANNEL_PORT",
	// libfabric (NIXL's LIBFABRIC backend); NIXL_LIBFABRIC_* (its parameter overrides) are listed too.
	"GONIXL_NIXL_DEPS", "FI_PROVIDER", "FI_TCP_IFACE", "FI_EFA_USE_DEVICE_RDMA", "FI_HMEM_CUDA_USE_GDRCOPY", "FI_LOG_LEVEL", "FI_LOG_PROV",
}

// envPrefixes are prefixes of further variables to report.
var envPrefixes = []string{"NIXL_LIBFABRIC_"}

const envHelp = `Reports, for each native dependency, where it was loaded from or every place that was tried:
  nixl    libnixl_capi.so: path, version, plugin folder, and per plugin its memory types and default
          parameters (read from a throwaway agent)
  zmq     the side channel's ZMTP version (pure Go, built in: no libzmq needed)
  cuda    libcuda.so.1: driver version, devices with name, memory (free/total)
  neuron  libnrt.so.1: runtime version and NeuronCores. This initialises the Neuron runtime for a moment,
          which claims the visible NeuronCores: while a vLLM/NxDI process holds them, it reports that error.
          Use --no-neuron-init to only check that the library loads.

A missing library is reported, not an error; --require makes it one (exit status 1), e.g.
  gonixl env --require nixl,cuda && start-decode-worker`

func runEnv(ctx context.Context, env *cmdEnv, args []string) error {
	fs := newFlagSet(env, envHelp)
	var nf nixlFlags
	nf.register(fs)
	asJSON := fs.Bool("json", false, "print the report as JSON")
	require := fs.String("require", "", "comma-separated components that must be usable: nixl, zmq, cuda, neuron (exit status 1 otherwise)")
	noNIXL := fs.Bool("no-nixl", false, "do not load NIXL (report it as skipped)")
	noNeuronInit := fs.Bool("no-neuron-init", false, "only check that libnrt loads; do not initialise the Neuron runtime")
	if err := parseNone(fs, args); err != nil {
		return err
	}
	var required []string
	for _, r := range strings.Split(*require, ",") {
		if r = strings.ToLower(strings.TrimSpace(r)); r == "" {
			continue
		}
		switch r {
		case "nixl", "zmq", "cuda", "neuron":
			required = append(required, r)
		default:
			return usagef("--require: unknown component %q (nixl, zmq, cuda, neuron)", r)
		}
	}

	// The environment as given: nixl.Load sets NIXL_PLUGIN_DIR when it is unset.
	vars := map[string]string{}
	for _, k := range envVars {
		if v, ok := os.LookupEnv(k); ok {
			vars[k] = v
		}
	}
	for _, kv := range os.Environ() {
		k, v, _ := strings.Cut(kv, "=")
		for _, p := range envPrefixes {
			if strings.HasPrefix(k, p) {
				vars[k] = v
			}
		}
	}
	nixlRep := nixlReport{libReport: libReport{Error: "skipped (--no-nixl)"}}
	if !*noNIXL {
		nixlRep = nixlEnv(nf)
	}
	rep := envReport{
		NIXL:   nixlRep,
		ZMQ:    zmqEnv(),
		CUDA:   cudaEnv(),
		Neuron: neuronEnv(!*noNeuronInit),
		Env:    vars,
	}
	if err := writeReport(env.stdout, *asJSON, rep, printEnv); err != nil {
		return err
	}
	var missing []string
	for _, r := range required {
		ok := map[string]bool{"nixl": rep.NIXL.Found, "zmq": rep.ZMQ.Found, "cuda": rep.CUDA.Found && rep.CUDA.DeviceCount > 0, "neuron": rep.Neuron.Found}[r]
		if !ok {
			missing = append(missing, r)
		}
	}
	if len(missing) > 0 {
		return &quietError{msg: "required but not usable: " + strings.Join(missing, ", ") + " (see the report above for what was tried)"}
	}
	return nil
}

func nixlEnv(nf nixlFlags) nixlReport {
	var r nixlReport
	lib, err := nf.load()
	if err != nil {
		r.failed(err, "libnixl_capi.so not found; run `make nixl` or set NIXL_LIB_DIR (or --nixl-lib-dir) to its folder")
		return r
	}
	r.Found, r.Path, r.Version, r.PluginDir, r.HasCustomParams = true, lib.Path(), nixlVersion(lib), lib.PluginDir(), lib.HasCustomParams()
	r.Deps = lib.Deps()
	r.DepDirs = lib.DepDirs()
	a, err := lib.NewAgent(throwawayAgentName("env"), nixl.AgentConfig{NoProgressThread: true})
	if err != nil {
		r.Error = "creating an agent: " + oneLine(err.Error())
		return r
	}
	defer a.Close()
	plugins, err := a.AvailablePlugins()
	if err != nil {
		r.Error = "listing plugins: " + oneLine(err.Error())
		return r
	}
	sort.Strings(plugins)
	for _, p := range plugins {
		pr := pluginReport{Name: p, File: filepath.Join(r.PluginDir, "libplugin_"+p+".so")}
		mems, params, err := a.PluginParams(p)
		if err != nil {
			pr.Missing, pr.Error = pluginProblems(pr.File, err)
		} else {
			pr.Loads = true
			for _, m := range mems {
				pr.MemTypes = append(pr.MemTypes, m.String())
			}
			pr.Params = params
		}
		if p == "LIBFABRIC" {
			pr.Needs, pr.Requires = fabricNeeds(pr.File)
		}
		r.Plugins = append(r.Plugins, pr)
	}
	return r
}

// fabricLibs are the libraries NIXL's LIBFABRIC plugin needs from outside NIXL's wheel (name prefixes).
var fabricLibs = []string{"libfabric.so", "libhwloc.so", "libcudart.so", "libcuda.so"}

// fabricNeeds reads which file each of the LIBFABRIC plugin's outside libraries resolves to (this process has
// preloaded $GONIXL_NIXL_DEPS's, and the loader matches them by soname) and what it needs from the environment.
func fabricNeeds(file string) (map[string]string, []string) {
	needs := map[string]string{}
	if rep, err := elfdeps.Check(file, elfdeps.Options{}); err == nil {
		for name, path := range rep.Resolved {
			for _, p := range fabricLibs {
				if strings.HasPrefix(name, p) {
					needs[name] = path
				}
			}
		}
		for _, m := range rep.Missing {
			for _, p := range fabricLibs {
				if strings.HasPrefix(m.Name, p) {
					needs[m.Name] = ""
				}
			}
		}
	}
	setOr := func(k string) string {
		if v, ok := os.LookupEnv(k); ok {
			return "set: " + k + "=" + v
		}
		return "unset"
	}
	return needs, []string{
		"FI_PROVIDER: efa or cxi on their fabrics, else tcp or sockets (the plugin takes no other; shm finds nothing) — " + setOr("FI_PROVIDER"),
		"FI_TCP_IFACE with tcp: the interface to use, not lo (the tcp provider fails there: fi_enable Bad file descriptor) — " + setOr("FI_TCP_IFACE"),
	}
}

// pluginProblems explains why NIXL could not load a plugin: NIXL's own error names at most the first
// library the loader missed, so the plugin's dependency closure is read from its ELF files instead
// (DT_NEEDED, RPATH/RUNPATH, LD_LIBRARY_PATH, version needs). It returns every problem and a one-line error.
func pluginProblems(file string, nixlErr error) ([]string, string) {
	rep, err := elfdeps.Check(file, elfdeps.Options{})
	switch {
	case err != nil:
		return nil, "cannot be loaded here: " + oneLine(nixlErr.Error()) + " (reading " + file + ": " + oneLine(err.Error()) + ")"
	case rep.OK():
		return nil, "its libraries are all found, but NIXL cannot load it: " + oneLine(nixlErr.Error())
	}
	probs := rep.Problems()
	return probs, "cannot be loaded here: " + strings.Join(probs, "; ")
}

// writeNeeds writes what the LIBFABRIC plugin needs from outside NIXL and where each was found.
func writeNeeds(w io.Writer, p pluginReport) {
	for _, k := range sortedKeys(p.Needs) {
		where := p.Needs[k]
		if where == "" {
			where = "NOT FOUND (make fabric-deps)"
		}
		fmt.Fprintf(w, "    %-12s   needs %s: %s\n", "", k, where)
	}
	for _, r := range p.Requires {
		fmt.Fprintf(w, "    %-12s   needs %s\n", "", r)
	}
}

// zmqEnv reports the side channel's ZMQ transport: built in (pure-Go ZMTP), so always found.
func zmqEnv() zmqReport {
	return zmqReport{Found: true, Version: sidechannel.ZMTPVersion}
}

func cudaEnv() cudaReport {
	var r cudaReport
	drv, err := cuda.Load(cuda.LoadOptions{})
	if err != nil {
		r.failed(err, "libcuda.so.1 not found (no NVIDIA driver here, or set GONIXL_CUDA_LIB)")
		return r
	}
	r.Found, r.Path, r.DriverVersion = true, drv.Path(), drv.VersionString()
	n, err := drv.DeviceCount()
	if err != nil {
		r.Error = "counting devices: " + oneLine(err.Error())
		return r
	}
	r.DeviceCount = n
	for i := 0; i < n; i++ {
		d := cudaDevice{Ordinal: i}
		dev, err := drv.Open(i)
		if err != nil {
			d.Error = oneLine(err.Error())
			r.Devices = append(r.Devices, d)
			continue
		}
		p := dev.Props()
		d.Name, d.UUID, d.PCIBusID, d.TotalMem = p.Name, p.UUIDString(), p.PCIBusID, p.TotalMem
		d.Compute = fmt.Sprintf("%d.%d", p.ComputeMajor, p.ComputeMinor)
		if free, total, err := dev.MemInfo(); err == nil {
			d.FreeMem, d.TotalMem = free, total
		}
		_ = dev.Close()
		r.Devices = append(r.Devices, d)
	}
	return r
}

func neuronEnv(initialise bool) neuronReport {
	var r neuronReport
	if !initialise {
		r.Found = neuron.Available(neuron.LoadOptions{})
		if !r.Found {
			r.Error = "libnrt.so.1 not found (tried $" + neuron.EnvLibPath + ", the loader path, " + strings.Join(neuron.StandardPaths, ", ") + ")"
		}
		return r
	}
	rt, err := neuron.Load(neuron.LoadOptions{})
	if err != nil {
		// The candidates tried, or the runtime's own status when libnrt loaded.
		r.Found = neuron.Available(neuron.LoadOptions{})
		r.failed(err, "libnrt.so.1 not found (set "+neuron.EnvLibPath+" to it)")
		return r
	}
	defer rt.Close()
	r.Found, r.Path = true, rt.Path()
	if v := rt.Version(); v != (neuron.Version{}) {
		r.Version = v.String()
	}
	r.VisibleCores, _ = rt.VisibleCores()
	r.TotalCores, _ = rt.TotalCores()
	return r
}

func printEnv(w io.Writer, r envReport) {
	fmt.Fprintln(w, "NIXL")
	if r.NIXL.Found {
		fmt.Fprintf(w, "  library      %s\n", r.NIXL.Path)
		ver := r.NIXL.Version
		if ver == "" {
			ver = "(unknown: no wheel metadata beside the library)"
		}
		fmt.Fprintf(w, "  version      %s\n", ver)
		fmt.Fprintf(w, "  plugin dir   %s\n", r.NIXL.PluginDir)
		if len(r.NIXL.DepDirs) == 0 {
			fmt.Fprintf(w, "  plugin deps  none preloaded (no $%s; `make fabric-deps` fills one for LIBFABRIC)\n", nixl.EnvDepDirs)
		} else {
			fmt.Fprintf(w, "  plugin deps  %s\n", strings.Join(r.NIXL.DepDirs, ":"))
		}
		for _, d := range r.NIXL.Deps {
			if d.Err != "" {
				fmt.Fprintf(w, "    not loaded %s: %s\n", d.Path, d.Err)
			} else {
				fmt.Fprintf(w, "    preloaded  %s\n", d.Path)
			}
		}
		fmt.Fprintf(w, "  plugins      %d\n", len(r.NIXL.Plugins))
		for _, p := range r.NIXL.Plugins {
			if p.Error != "" && len(p.Missing) > 0 {
				fmt.Fprintf(w, "    %-12s cannot be loaded here; missing:\n", p.Name)
				for _, m := range p.Missing {
					fmt.Fprintf(w, "    %-12s   %s\n", "", m)
				}
				writeNeeds(w, pluginReport{Requires: p.Requires}) // the missing libraries are listed above
				continue
			}
			if p.Error != "" {
				fmt.Fprintf(w, "    %-12s %s\n", p.Name, p.Error)
				continue
			}
			fmt.Fprintf(w, "    %-12s mem: %s\n", p.Name, strings.Join(p.MemTypes, ","))
			for _, k := range sortedKeys(p.Params) {
				fmt.Fprintf(w, "    %-12s   %s=%s\n", "", k, p.Params[k])
			}
			writeNeeds(w, p)
		}
	} else if len(r.NIXL.Tried) == 0 {
		fmt.Fprintf(w, "  %s\n", r.NIXL.Error) // skipped (--no-nixl), or an error that lists no candidates
	} else {
		r.NIXL.writeNotLoaded(w)
	}
	if r.NIXL.Found && r.NIXL.Error != "" {
		fmt.Fprintf(w, "  error        %s\n", r.NIXL.Error)
	}

	fmt.Fprintln(w, "ZMQ side channel")
	fmt.Fprintf(w, "  protocol     %s (pure Go, built in; no libzmq)\n", r.ZMQ.Version)

	fmt.Fprintln(w, "CUDA")
	if r.CUDA.Found {
		fmt.Fprintf(w, "  library      %s\n", r.CUDA.Path)
		fmt.Fprintf(w, "  driver       CUDA %s\n", r.CUDA.DriverVersion)
		fmt.Fprintf(w, "  devices      %d\n", r.CUDA.DeviceCount)
		for _, d := range r.CUDA.Devices {
			if d.Error != "" {
				fmt.Fprintf(w, "    [%d] error: %s\n", d.Ordinal, d.Error)
				continue
			}
			fmt.Fprintf(w, "    [%d] %s (sm %s, %s) %s, %s free of %s\n", d.Ordinal, d.Name, d.Compute, d.PCIBusID, d.UUID,
				humanBytes(int64(d.FreeMem)), humanBytes(int64(d.TotalMem)))
		}
		if r.CUDA.Error != "" {
			fmt.Fprintf(w, "  error        %s\n", r.CUDA.Error)
		}
	} else {
		r.CUDA.writeNotLoaded(w)
	}

	fmt.Fprintln(w, "Neuron")
	switch {
	case r.Neuron.Path != "":
		fmt.Fprintf(w, "  library      %s\n", r.Neuron.Path)
		if r.Neuron.Version != "" {
			fmt.Fprintf(w, "  version      %s\n", r.Neuron.Version)
		}
		fmt.Fprintf(w, "  NeuronCores  %d visible of %d\n", r.Neuron.VisibleCores, r.Neuron.TotalCores)
	case r.Neuron.Found && r.Neuron.Error == "":
		fmt.Fprintf(w, "  libnrt loads (runtime not initialised: --no-neuron-init)\n")
	case r.Neuron.Found:
		fmt.Fprintf(w, "  libnrt loads, but: %s\n", r.Neuron.Error)
	default:
		r.Neuron.writeNotLoaded(w)
	}

	if len(r.Env) > 0 {
		fmt.Fprintln(w, "Environment")
		for _, k := range sortedKeys(r.Env) {
			fmt.Fprintf(w, "  %s=%s\n", k, r.Env[k])
		}
	}
}
