package nixl

import (
	"maps"
	"runtime"
	"slices"
	"strconv"
	"strings"
)

// UCXErrorHandling is the UCX backend's endpoint error-handling mode ("ucx_error_handling_mode").
type UCXErrorHandling string

// Error-handling modes of NIXL's UCX backend.
const (
	UCXErrorsDefault UCXErrorHandling = ""     // NIXL's default: peer
	UCXErrorsPeer    UCXErrorHandling = "peer" // endpoints detect a failed peer (keepalive); a dead peer fails the transfer
	UCXErrorsNone    UCXErrorHandling = "none" // no peer-failure handling: lets UCX pick protocols that cannot recover from one
)

// UCXOptions are the init parameters of NIXL's UCX backend (NIXL 1.5.1's src/plugins/ucx; the names NIXL
// reads are in brackets). The zero value asks for NIXL's own defaults; DefaultUCXOptions gives gonixl's.
//
// Every UCX_* environment variable still wins over Engine: NIXL applies an engine_config key only when
// UCX_<KEY> is unset (and so do NIXL's own UCX settings, such as RNDV_THRESH=inf).
type UCXOptions struct {
	// Devices restricts UCX to these network devices ("device_list", e.g. "mlx5_0"); empty: all.
	Devices []string
	// NumWorkers is the number of shared UCX workers ("num_workers"); 0: NIXL's default, 1.
	NumWorkers int
	// NumThreads > 0 selects NIXL's thread-pool engine ("num_threads"): that many threads, each with
	// its own UCX worker, post and progress the descriptors of a large request in parallel. 0: none
	// (one worker, progressed by the progress thread or by polling).
	NumThreads int
	// SplitBatchSize is how many descriptors one pool thread takes at a time ("split_batch_size"; NIXL's
	// default 1024, which leaves a request of fewer descriptors on one thread). Only with NumThreads > 0.
	SplitBatchSize int
	// ErrorHandling is the endpoints' error-handling mode ("ucx_error_handling_mode").
	ErrorHandling UCXErrorHandling
	// Engine holds UCX configuration keys without the UCX_ prefix ("engine_config", sent as
	// KEY=VALUE,KEY=VALUE), e.g. {"RMA_PPLN_ENABLE": "y"}; keys and values may not contain ',' or '='.
	Engine map[string]string
}

// UCX engine_config keys gonixl sets by default (see DefaultUCXOptions).
const (
	// UCXRMAPipeline ("RMA_PPLN_ENABLE") lets UCX serve an RMA (a NIXL READ or WRITE) whose local or
	// remote side is GPU memory by a rendezvous pipeline through cuda_copy / cuda_ipc, instead of a software
	// emulation over tcp (BenchmarkDRAMToVRAM's nixl-defaults against gonixl-defaults variants,
	// docs/measured.md). The target side must then keep progressing (a progress thread, or the prefill
	// role's notification poll).
	UCXRMAPipeline = "RMA_PPLN_ENABLE"
)

// DefaultUCXOptions are gonixl's UCX settings, chosen from measurements (docs/measured.md): the
// RMA pipeline on (UCX's only protocol that moves host memory into GPU memory without a software emulation;
// no effect on DRAM↔DRAM), and a thread pool of one thread per core, at least 4 and at most 16, taking 4
// descriptors at a time. BenchmarkDRAMToDRAM states the pool against NIXL's own defaults (ucx=gonixl-defaults
// against ucx=nixl-defaults; GONIXL_BENCH_SWEEP adds thread counts and batch sizes); these were chosen from
// its runs on a 16-core GPU host, for 32 KiB and 2 MiB blocks alike, where larger batches left requests of
// few descriptors on one thread. The connector's decode role adapts them (connector.RoleConfig.Backends; its READs into DRAM use read
// agents instead of the pool, BenchmarkVLLMSideBySide).
func DefaultUCXOptions() UCXOptions {
	return UCXOptions{
		Engine:         map[string]string{UCXRMAPipeline: "y"},
		NumThreads:     min(16, max(4, runtime.NumCPU())),
		SplitBatchSize: 4,
	}
}

// Params returns the backend parameters NIXL's UCX plugin reads, or an error naming the field that cannot
// be expressed.
func (o UCXOptions) Params() (map[string]string, error) {
	p := map[string]string{}
	if len(o.Devices) > 0 {
		for _, d := range o.Devices {
			if d == "" || strings.ContainsAny(d, ", ") {
				return nil, goErr("UCX options", ErrInvalidParam, "device %q is empty or contains ',' or ' '; list devices as UCX names (mlx5_0:1)", d)
			}
		}
		p["device_list"] = strings.Join(o.Devices, ",")
	}
	for _, f := range []struct {
		name string
		v    int
	}{{"num_workers", o.NumWorkers}, {"num_threads", o.NumThreads}, {"split_batch_size", o.SplitBatchSize}} {
		if f.v < 0 {
			return nil, goErr("UCX options", ErrInvalidParam, "%s = %d, want ≥ 0 (0 = NIXL's default)", f.name, f.v)
		}
		if f.v > 0 {
			p[f.name] = strconv.Itoa(f.v)
		}
	}
	switch o.ErrorHandling {
	case UCXErrorsDefault:
	case UCXErrorsPeer, UCXErrorsNone:
		p["ucx_error_handling_mode"] = string(o.ErrorHandling)
	default:
		return nil, goErr("UCX options", ErrInvalidParam, "error handling %q, want %q, %q or \"\" (NIXL's default)", o.ErrorHandling, UCXErrorsPeer, UCXErrorsNone)
	}
	if len(o.Engine) > 0 {
		keys := slices.Sorted(maps.Keys(o.Engine))
		parts := make([]string, 0, len(keys))
		for _, k := range keys {
			v := o.Engine[k]
			if k == "" || strings.ContainsAny(k, ",=") || strings.ContainsAny(v, ",=") {
				return nil, goErr("UCX options", ErrInvalidParam, "engine_config %q=%q: keys must be non-empty, and keys and values may not contain ',' or '='", k, v)
			}
			parts = append(parts, strings.TrimPrefix(k, "UCX_")+"="+v)
		}
		p["engine_config"] = strings.Join(parts, ",")
	}
	return p, nil
}

// Spec returns the BackendSpec of a UCX backend with these options.
func (o UCXOptions) Spec() (BackendSpec, error) {
	p, err := o.Params()
	if err != nil {
		return BackendSpec{}, err
	}
	return BackendSpec{Plugin: "UCX", Params: p}, nil
}
