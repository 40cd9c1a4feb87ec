// Command minimal is gonixl's public API in one file, top to bottom: a prefill role and a decode role, each
// with its own DRAM cache and NIXL agent, move one request's KV blocks the way vLLM's NixlConnector does.
//
//  1. connector.NewPrefill: the prefill role (what a vLLM prefill worker is to its decode peers): a KV cache
//     registered with NIXL, and the ZMQ side channel that hands out its NIXL metadata.
//  2. Prefill.Hold: a request's blocks are allocated, filled by the FillFunc (here a pattern; on Trainium a
//     neuron.Stager's Fill) and held for the decode peer; the kv_transfer_params it returns are what the
//     prefill's HTTP response carries (Profile.EncodeParams) and the decode side reads (Profile.DecodeParams).
//  3. connector.NewDecode and Decode.Pull: the decode role handshakes over the side channel (once per prefill
//     engine), checks the compatibility hash and the block ids, READs the blocks and sends the notification.
//  4. The prefill role frees the blocks on that notification; Close releases each role.
//
// examples/prefill and examples/decode wrap the same calls in vLLM's OpenAI-compatible HTTP API (their
// plumbing is examples/internal/demo: NewPrefillServer and the completions handler for NewPrefill and Hold,
// NewDecodeServer and its handler for NewDecode and Pull). Run: make nixl, then
//
//	NIXL_LIB_DIR=$PWD/.nixl/current/lib go run ./examples/minimal
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/gonixl/gonixl/connector"
	"github.com/gonixl/gonixl/layout"
	"github.com/gonixl/gonixl/nixl"
)

func main() {
	version := flag.String("vllm-version", "0.33.0", "the vLLM version of the peers (picks the wire profile)")
	tokens := flag.Int("tokens", 40, "prompt length in tokens")
	flag.Parse()
	if err := run(*version, *tokens); err != nil {
		fmt.Fprintln(os.Stderr, "minimal:", err)
		os.Exit(1)
	}
}

func run(version string, tokens int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// NIXL's native libraries load at run time: LoadOptions.LibDir, $NIXL_LIB_DIR, the loader's path, then
	// nixl.StandardPaths. The error lists every place tried.
	lib, err := nixl.Load(nixl.LoadOptions{})
	if err != nil {
		return err
	}

	// The model is stated once, as vLLM was given it; the roles derive the per-rank geometry, the region plan
	// of the version's layout era and the compatibility hash's inputs.
	model := connector.Model{Name: "Qwen/Qwen3-0.6B", Layers: 28, KVHeads: 8, HeadDim: 128, DType: layout.BF16}

	// 1. The prefill role. With no Cache set it allocates a DRAMCache of NumBlocks blocks; Host and Port are
	// its side channel (default 127.0.0.1 and a free port; vLLM's default port is 5600).
	pre, err := connector.NewPrefill(connector.PrefillConfig{
		RoleConfig: connector.RoleConfig{VLLMVersion: version, Model: model, NumBlocks: 32, Library: lib},
	})
	if err != nil {
		return err
	}
	defer pre.Close()
	fmt.Printf("prefill: engine %s, side channel 127.0.0.1:%d, vLLM %s wire profile\n", pre.EngineID(), pre.Port(), version)

	// 2. Hold: the role picks the blocks and calls fill with their ids; fill writes the prompt's KV there.
	src := pre.Cache().(*connector.DRAMCache)
	g := src.Geometry()
	fill := func(_ context.Context, blocks []int) error {
		for r := 0; r < g.NumRegions(); r++ {
			for _, b := range blocks {
				blk := src.Region(r)[int64(b)*g.BlockLen():][:g.BlockLen()]
				for i := range blk {
					blk[i] = byte(r + b + i)
				}
			}
		}
		return nil
	}
	params, err := pre.Hold(ctx, "req-1", tokens, fill)
	if err != nil {
		return err
	}
	wire, err := pre.Profile().EncodeParams(params) // the kv_transfer_params of the prefill's HTTP response
	if err != nil {
		return err
	}
	fmt.Printf("prefill: holding req-1 (%d tokens, blocks %v); kv_transfer_params %d bytes of JSON\n",
		tokens, params.RemoteBlockIDs.Flat(), len(wire))

	// 3. The decode role, and the pull. The decode side reads the params from the proxy's request; its own
	// scheduler picked the local blocks (here 1..n; block 0 is the null block on both sides).
	dec, err := connector.NewDecode(connector.DecodeConfig{
		RoleConfig: connector.RoleConfig{VLLMVersion: version, Model: model, NumBlocks: 32, Library: lib},
	})
	if err != nil {
		return err
	}
	defer dec.Close()
	kv, err := dec.Profile().DecodeParams(wire)
	if err != nil {
		return err
	}
	remote := kv.RemoteBlockIDs.Flat()
	local := make([]int, len(remote))
	for i := range local {
		local[i] = i + 1
	}
	res, err := dec.Pull(ctx, "req-1", kv, local) // handshake (cached per engine), checks, READ, notification
	if err != nil {
		return err
	}
	fmt.Printf("decode: pulled %d blocks, %d bytes (handshake %v, transfer %v)\n", res.Blocks, res.Bytes,
		res.Handshake.Round(time.Millisecond), res.Transfer.Round(time.Microsecond))

	// Every byte arrived where the decode's scheduler wanted it.
	dst := dec.Cache().(*connector.DRAMCache)
	for r := 0; r < g.NumRegions(); r++ {
		for i, b := range remote {
			want := src.Region(r)[b*g.BlockLen():][:g.BlockLen()]
			got := dst.Region(r)[int64(local[i])*g.BlockLen():][:g.BlockLen()]
			if !bytes.Equal(got, want) {
				return fmt.Errorf("region %d: local block %d differs from remote block %d", r, local[i], b)
			}
		}
	}

	// 4. The prefill role frees the blocks when the decode's notification arrives (or at its hold timeout).
	for pre.Held() > 0 {
		select {
		case <-ctx.Done():
			return fmt.Errorf("prefill still holds %d blocks: %w", pre.Held(), ctx.Err())
		case <-time.After(time.Millisecond):
		}
	}
	fmt.Printf("prefill: freed %d blocks on the decode's notification\n", pre.Metrics().BlocksFreed())
	fmt.Println("OK: every byte verified")
	return nil
}
