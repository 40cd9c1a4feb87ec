package demo

import (
	"flag"
	"fmt"
	"os"
	"runtime/trace"
	"strings"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/gonixl/gonixl/connector"
	"github.com/gonixl/gonixl/layout"
	"github.com/gonixl/gonixl/nixl"
)

// Common holds the flags the demo programs share.
type Common struct {
	VLLMVersion string
	NumBlocks   int
	Order       string
	Backends    string
	LogLevel    string
	NIXLLibDir  string
	DataDevice  string
	Trace       string
}

// Register adds the shared flags to fs.
func (c *Common) Register(fs *flag.FlagSet) {
	fs.StringVar(&c.VLLMVersion, "vllm-version", "0.16.0", "vLLM version of the peer (selects the wire profile)")
	fs.IntVar(&c.NumBlocks, "num-blocks", 640, "KV blocks in the cache (vLLM's num_blocks; block 0 is the null block)")
	fs.StringVar(&c.Order, "kv-layout", "HND", "physical block order the decode side expects: HND or NHD")
	fs.StringVar(&c.Backends, "backends", "UCX", "comma-separated NIXL backends, e.g. UCX or LIBFABRIC")
	fs.StringVar(&c.LogLevel, "log-level", "warn", "log level: debug, info, warn, error")
	fs.StringVar(&c.DataDevice, "data-device", "", "UCX network device of NIXL's data plane (default: loopback when the worker listens on loopback; \"all\": every device; or e.g. eth1, mlx5_0:1)")
	fs.StringVar(&c.Trace, "trace", "", "write a runtime/trace execution trace to this file (view it with go tool trace); an orchestrating example writes its own there and gives its workers FILE.prefill and FILE.decode")
	fs.StringVar(&c.NIXLLibDir, "nixl-lib-dir", "", "folder of libnixl_capi.so (default: $NIXL_LIB_DIR, the loader path, then "+strings.Join(nixl.StandardPaths, ", ")+")")
}

// StartTrace starts the execution trace -trace names (nothing when it is empty) and returns the function that
// stops it and closes the file.
func (c *Common) StartTrace() (stop func() error, err error) {
	if c.Trace == "" {
		return func() error { return nil }, nil
	}
	f, err := os.Create(c.Trace)
	if err != nil {
		return nil, fmt.Errorf("-trace: %w", err)
	}
	if err := trace.Start(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("-trace %s: %w", c.Trace, err)
	}
	return func() error { trace.Stop(); return f.Close() }, nil
}

// TraceArgs are the -trace flag for the worker of role ("prefill", "decode"): FILE.role, or none.
func (c *Common) TraceArgs(role string) []string {
	if c.Trace == "" {
		return nil
	}
	return []string{"-trace", c.Trace + "." + role}
}

// Logger returns a console logger at the flag's level (to stderr).
func (c *Common) Logger() *zap.Logger {
	lvl, err := zapcore.ParseLevel(c.LogLevel)
	if err != nil {
		lvl = zapcore.WarnLevel
	}
	cfg := zap.NewDevelopmentConfig()
	cfg.Level = zap.NewAtomicLevelAt(lvl)
	cfg.DisableStacktrace = true
	log, err := cfg.Build()
	if err != nil {
		return zap.NewNop()
	}
	return log
}

// BlockOrder parses -kv-layout.
func (c *Common) BlockOrder() (layout.BlockOrder, error) { return layout.ParseBlockOrder(c.Order) }

// BackendSpecs parses -backends.
func (c *Common) BackendSpecs() []nixl.BackendSpec {
	return connector.ParseBackends(strings.Split(c.Backends, ","))
}

// Library loads NIXL.
func (c *Common) Library(log *zap.Logger) (*nixl.Library, error) {
	return nixl.Load(nixl.LoadOptions{LibDir: c.NIXLLibDir, Logger: log})
}
