package demo

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
)

// Main runs the "prefill" or "decode" server with args until SIGINT or SIGTERM; when it fails, Main prints
// the error and exits 1. It is the whole main of the example commands.
func Main(role string, args []string) { serve(role, role, args) }

// ServeSubcommand runs the server that args name ("serve-prefill ARGS..." or "serve-decode ARGS...": how the
// orchestrating examples start their workers from their own binary) and reports whether args named one.
func ServeSubcommand(args []string) bool {
	if len(args) == 0 || (args[0] != "serve-prefill" && args[0] != "serve-decode") {
		return false
	}
	serve(args[0], strings.TrimPrefix(args[0], "serve-"), args[1:])
	return true
}

// serve runs role's server; errors are printed after name.
func serve(name, role string, args []string) {
	run := RunPrefill
	if role == "decode" {
		run = RunDecode
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, args)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, name+":", err)
		os.Exit(1)
	}
}

// GBps is the throughput of bytes moved in msec milliseconds, in GB/s (0 for no time), as the examples'
// summaries print it.
func GBps(bytes int64, msec float64) float64 {
	if msec <= 0 {
		return 0
	}
	return float64(bytes) / (msec / 1000) / 1e9
}
