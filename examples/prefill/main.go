// Command prefill is a Go prefill worker wire-compatible with vLLM's NixlConnector: its KV cache lives on a
// Neuron device (gonixl's fake libnrt when no Trainium is present) and is staged through NIXL-registered DRAM
// for the decode peer to READ. It serves vLLM's OpenAI-compatible /v1/completions with kv_transfer_params.
// With -cuda-context auto (the default) it holds GPU 0's primary CUDA context when a CUDA driver and device are
// present, so that a decode worker on the same host reads into GPU memory through UCX's cuda_copy / cuda_ipc
// instead of a software emulation over TCP (README: "A CUDA context on the prefill side").
//
// The gonixl API it uses sits in examples/internal/demo, shared with examples/disagg (which re-executes its own
// binary as this worker: "serve-prefill"), examples/engine and their tests: prefill.go's NewPrefillServer
// (the Neuron tensors, the neuron.Stager and connector.NewPrefill over it), its completions handler
// (Prefill.Hold with the Stager's Fill, Profile.EncodeParams) and Close. examples/minimal shows the same calls
// alone, top to bottom.
package main

import (
	"os"

	"github.com/gonixl/gonixl/examples/internal/demo"
)

func main() { demo.Main("prefill", os.Args[1:]) }
