package demo

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"strings"

	"go.uber.org/zap"

	"github.com/gonixl/gonixl/connector"
	"github.com/gonixl/gonixl/layout"
	"github.com/gonixl/gonixl/nixl"
)

// RunPrefill is the main of the prefill worker: it parses args, serves until ctx ends, and prints
// "READY <url>" on stdout once it listens. When ctx ends (SIGTERM) at any time, start-up included, it stops,
// releases everything (the fake libnrt's temporary folder too) and returns nil.
func RunPrefill(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("prefill", flag.ContinueOnError)
	var c Common
	c.Register(fs)
	addr := fs.String("http", "127.0.0.1:8100", "HTTP listen address (OpenAI-compatible API)")
	side := fs.Int("side-channel-port", 0, "ZMQ side-channel port (0: a free port; vLLM's default is 5600)")
	sideHost := fs.String("side-channel-host", "127.0.0.1", "ZMQ side-channel host: it binds there and advertises it as remote_host")
	rows := fs.Int("batch-rows", 4, "NxDI batch rows of the device KV tensors (concurrent prefills)")
	maxSeq := fs.Int("max-seq", 3072, "NxDI KV cache length per row (longest prompt)")
	nrt := fs.String("nrt-lib", "", "libnrt path (default: libnrt.so.1 if installed, else gonixl's fake libnrt)")
	label := fs.String("kv-layout-label", "", "kv_cache_layout label to publish when it differs from -kv-layout (a vLLM 0.16 decode worker with kv_buffer_device=cpu: -kv-layout NHD -kv-layout-label HND)")
	cudaCtx := fs.String("cuda-context", CUDAContextAuto, "hold GPU 0's primary CUDA context: auto (when a CUDA driver and device are present), on, off. A decode worker on this host reading into GPU memory needs it: UCX then moves the bytes by cuda_copy / cuda_ipc instead of a software emulation over TCP")
	notifyFrom := fs.String("notify-from", "", "comma-separated NIXL agent names (or prefixes ending in *) whose notifications may free or extend held blocks (default: any agent; the unguessable suffix of remote_request_id is checked either way)")
	pin := fs.Bool("cuda-pin-staging", true, "with a CUDA context, page-lock the staging arena for CUDA (cuMemHostRegister)")
	prefixBlocks := fs.Int("prefix-cache-blocks", 0, "keep up to N finished (unheld) blocks in a prefix cache and reuse a prompt's cached leading blocks (vLLM's prefix caching; 0: off)")
	kvEvents := fs.String("kv-events", "", "publish vLLM's KV events of the prefix cache on a ZMQ PUB socket at this TCP address, e.g. 127.0.0.1:0 (the bound address is in GET /version and the READY line; needs -prefix-cache-blocks)")
	kvReplay := fs.String("kv-events-replay", "", "serve replay requests for recent KV-event batches on a ZMQ ROUTER socket at this TCP address (needs -kv-events)")
	kvTopic := fs.String("kv-events-topic", "", "ZMQ topic of the KV events")
	busyPoll := fs.Duration("busy-poll", 0, "interval of the role's NIXL polls while blocks are held (0: back to back, a busy core while a decode peer may be reading; e.g. 50us spares the core at some READ speed)")
	hashSeed := fs.String("python-hash-seed", "", "the PYTHONHASHSEED the vLLM engines run with, for the prefix cache's block hashes (default: vLLM's own default for the release)")
	w, err := c.start(fs, args)
	if err != nil {
		return err
	}
	defer w.stop()
	log, lib, order := w.log, w.lib, w.order
	cfg := PrefillConfig{VLLMVersion: c.VLLMVersion, Model: Qwen3_0_6B, NumBlocks: c.NumBlocks, BatchRows: *rows,
		MaxSeq: *maxSeq, Order: order, NRTPath: *nrt, Label: *label, Backends: c.BackendSpecs(), Library: lib, Logger: log, SideChannel: *side,
		SideHost: *sideHost, DataDevice: c.DataDevice, CUDAContext: *cudaCtx, NoPinStaging: !*pin, NotifyFrom: splitList(*notifyFrom), BusyPoll: *busyPoll}
	if cfg.PrefixCache, cfg.KVEvents, err = prefixFlags(fs, *prefixBlocks, *kvEvents, *kvReplay, *kvTopic, *hashSeed); err != nil {
		return err
	}
	s, err := NewPrefillServer(ctx, cfg)
	if err != nil {
		if ctx.Err() != nil {
			return nil // stopped during start-up: a clean stop
		}
		return err
	}
	defer s.Close()
	return Serve(ctx, *addr, s.Handler(), func(url string) {
		cudaInfo := "none"
		if d := s.CUDADevice(); d != nil {
			cudaInfo = fmt.Sprintf("%q", d.Props().Name)
			if s.pinned != nil {
				cudaInfo += ",staging-pinned"
			}
		}
		events := ""
		if ev := s.VersionInfo().KVEvents; ev != nil {
			events = " kv-events=" + ev.Endpoint
		}
		fmt.Fprintf(os.Stdout, "READY %s side-channel=%d engine=%s cuda-context=%s%s\n", url, s.Role().Port(), s.Role().EngineID(), cudaInfo, events)
	})
}

// prefixFlags turns the prefill's prefix-cache flags into its configuration (nil, nil: no prefix cache).
func prefixFlags(fs *flag.FlagSet, blocks int, events, replay, topic, hashSeed string) (*connector.PrefixCacheConfig, *connector.KVEventsConfig, error) {
	seedSet := false
	fs.Visit(func(f *flag.Flag) { seedSet = seedSet || f.Name == "python-hash-seed" })
	switch {
	case blocks < 0:
		return nil, nil, fmt.Errorf("-prefix-cache-blocks %d: want 0 (off) or more", blocks)
	case blocks == 0 && (events != "" || seedSet):
		return nil, nil, errors.New("-kv-events and -python-hash-seed are about the prefix cache: set -prefix-cache-blocks too")
	case events == "" && (replay != "" || topic != ""):
		return nil, nil, errors.New("-kv-events-replay and -kv-events-topic need -kv-events")
	case blocks == 0:
		return nil, nil, nil
	}
	pc := &connector.PrefixCacheConfig{MaxBlocks: blocks}
	if seedSet {
		pc.PythonHashSeed = &hashSeed
	}
	if events == "" {
		return pc, nil, nil
	}
	return pc, &connector.KVEventsConfig{Addr: events, ReplayAddr: replay, Topic: topic}, nil
}

// RunDecode is the main of the decode worker.
func RunDecode(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("decode", flag.ContinueOnError)
	var c Common
	c.Register(fs)
	addr := fs.String("http", "127.0.0.1:8200", "HTTP listen address (OpenAI-compatible API)")
	where := fs.String("cache", "auto", "where the KV cache lives: auto (GPU memory when a CUDA GPU is present, else DRAM), gpu, dram, or hostbuf (NIXL into pinned DRAM, then copied to GPU memory)")
	gpu := fs.Bool("gpu", false, "same as -cache gpu")
	readAgents := fs.Int("read-agents", 0, "NIXL agents of the decode's own that split each READ (connector.DecodeConfig.ReadAgents): 0 = the default (4 for a DRAM cache on two CPUs or more, none for GPU memory), 1 = none")
	readSpin := fs.Duration("read-spin", 0, "how long the decode polls a READ back to back before backing off to sleeps (connector.DecodeConfig.ReadSpin): 0 = the default (10ms into GPU memory, none into DRAM), negative = none")
	w, err := c.start(fs, args)
	if err != nil {
		return err
	}
	defer w.stop()
	log, lib, order := w.log, w.lib, w.order
	cfg := DecodeConfig{VLLMVersion: c.VLLMVersion, Model: Qwen3_0_6B, NumBlocks: c.NumBlocks, Order: order,
		Backends: c.BackendSpecs(), Library: lib, Logger: log, DataDevice: c.DataDevice, ReadAgents: *readAgents, ReadSpin: *readSpin}
	if cfg.DataDevice == "" { // the decode worker's peers are where its HTTP API is: loopback in the demo
		if host, _, err := net.SplitHostPort(*addr); err == nil {
			cfg.DataDevice = connector.DataDeviceFor(host)
		}
	}
	if *gpu {
		*where = "gpu"
	}
	kind := "DRAM"
	switch *where {
	case "auto", "gpu":
		cache, closeCache, err := newGPUCache(cfg)
		if err != nil {
			if *where == "gpu" {
				return err
			}
			log.Info("no usable CUDA GPU; the KV cache lives in DRAM", zap.Error(err))
			break
		}
		defer closeCache()
		cfg.Cache = cache
		kind = "VRAM"
	case "hostbuf":
		cache, closeCache, err := newHostBufCache(cfg)
		if err != nil {
			return err
		}
		defer closeCache()
		cfg.Cache = cache
		kind = "DRAM→VRAM"
	case "dram":
	default:
		return fmt.Errorf("-cache %q: want auto, gpu, dram or hostbuf", *where)
	}
	s, err := NewDecodeServer(cfg)
	if err != nil {
		return err
	}
	defer s.Close()
	return Serve(ctx, *addr, s.Handler(), func(url string) {
		fmt.Fprintf(os.Stdout, "READY %s engine=%s cache=%s\n", url, s.Role().EngineID(), kind)
	})
}

// worker is what both workers' mains start from: the logger, NIXL, the block order and the running trace.
type worker struct {
	log       *zap.Logger
	lib       *nixl.Library
	order     layout.BlockOrder
	stopTrace func() error
}

// start parses the flags, then makes the logger, loads NIXL, reads the block order and starts the -trace
// execution trace. The caller defers stop.
func (c *Common) start(fs *flag.FlagSet, args []string) (worker, error) {
	if err := fs.Parse(args); err != nil {
		return worker{}, err
	}
	w := worker{log: c.Logger()}
	var err error
	if w.lib, err = c.Library(w.log); err != nil {
		return worker{}, err
	}
	if w.order, err = c.BlockOrder(); err != nil {
		return worker{}, err
	}
	if w.stopTrace, err = c.StartTrace(); err != nil {
		w.log.Sync()
		return worker{}, err
	}
	return w, nil
}

// stop stops the trace, then flushes the logger.
func (w worker) stop() {
	w.stopTrace()
	w.log.Sync()
}

// splitList splits a comma-separated flag value, dropping empty items.
func splitList(v string) []string {
	var out []string
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}
