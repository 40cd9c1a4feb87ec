// Command decode is a Go decode worker wire-compatible with vLLM's NixlConnector: it READs a request's KV blocks
// from the prefill worker over NIXL into a DRAM cache (or CUDA device memory with -gpu) and verifies them.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/gonixl/gonixl/examples/internal/demo"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := demo.RunDecode(ctx, os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "decode:", err)
		os.Exit(1)
	}
}
