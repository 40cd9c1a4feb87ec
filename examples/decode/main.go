// Command decode is a Go decode worker wire-compatible with vLLM's NixlConnector: it READs a request's KV blocks
// from the prefill worker over NIXL into a DRAM cache (or CUDA device memory with -gpu) and verifies them.
package main

import (
	"os"

	"github.com/gonixl/gonixl/examples/internal/demo"
)

func main() { demo.Main("decode", os.Args[1:]) }
