// Command decode is a Go decode worker wire-compatible with vLLM's NixlConnector: it READs a request's KV blocks
// from the prefill worker over NIXL into a DRAM cache (or CUDA device memory with -gpu) and verifies them.
//
// The gonixl API it uses sits in examples/internal/demo, shared with examples/disagg (which re-executes its own
// binary as this worker: "serve-decode") and their tests: decode.go's NewDecodeServer (the cache and
// connector.NewDecode), its completions handler (kv_transfer_params through Profile.DecodeParams, Decode.Pull)
// and Close. examples/minimal shows the same calls alone, top to bottom.
package main

import (
	"os"

	"github.com/gonixl/gonixl/examples/internal/demo"
)

func main() { demo.Main("decode", os.Args[1:]) }
