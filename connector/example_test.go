package connector_test

import (
	"bytes"
	"context"
	"fmt"
	"time"

	"github.com/gonixl/gonixl/connector"
	"github.com/gonixl/gonixl/layout"
	"github.com/gonixl/gonixl/nixl"
)

// A prefill role and a decode role in one process, each with its own DRAM cache and NIXL agent, move one
// request the way vLLM's NixlConnector does: P fills the blocks and returns kv_transfer_params; D handshakes
// over the ZMQ side channel, READs the blocks over UCX with the notification that frees them on P. The model
// is described once; the vLLM version picks the wire profile, the layout era and the hash defaults.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	lib, err := nixl.Load(nixl.LoadOptions{}) // $NIXL_LIB_DIR, the loader's path, then nixl.StandardPaths
	if err != nil {
		fmt.Println(err)
		return
	}
	qwen := connector.Model{Name: "Qwen/Qwen3-0.6B", Layers: 28, KVHeads: 8, HeadDim: 128, DType: layout.BF16}
	pre, err := connector.NewPrefill(connector.PrefillConfig{RoleConfig: connector.RoleConfig{VLLMVersion: "0.16.0", Model: qwen, NumBlocks: 16, Library: lib}})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pre.Close()

	// The fill function writes the prompt's KV into the blocks P hands out (here: a marker in every region).
	cache := pre.Cache().(*connector.DRAMCache)
	g := cache.Geometry()
	fill := func(_ context.Context, blocks []int) error {
		for r := 0; r < g.NumRegions(); r++ {
			copy(cache.Region(r)[int64(blocks[0])*g.BlockLen():], fmt.Sprintf("layer %d %s", r/2, "KV"[r%2:r%2+1]))
		}
		return nil
	}
	params, err := pre.Hold(ctx, "req-1", 20, fill) // 20 tokens → 2 blocks
	if err != nil {
		fmt.Println(err)
		return
	}
	raw, _ := pre.Profile().EncodeParams(params) // what P's HTTP response carries; the proxy hands it to D
	fmt.Println(bytes.Contains(raw, []byte(`"remote_engine_id": "`+pre.EngineID()+`"`)))

	dec, err := connector.NewDecode(connector.DecodeConfig{RoleConfig: connector.RoleConfig{VLLMVersion: "0.16.0", Model: qwen, NumBlocks: 16, Library: lib}})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer dec.Close()
	res, err := dec.Pull(ctx, "req-1", params, []int{5, 6}) // handshake (cached), checks, READ, notification
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("pulled %d blocks, %d bytes\n", res.Blocks, res.Bytes)
	got := dec.Cache().(*connector.DRAMCache).Region(55)[5*g.BlockLen():]
	fmt.Println(string(bytes.TrimRight(got[:16], "\x00")))

	// P frees the blocks once D's notification arrives.
	for pre.Held() > 0 && ctx.Err() == nil {
		time.Sleep(time.Millisecond)
	}
	fmt.Println("held on P:", pre.Held(), "freed:", pre.Metrics().BlocksFreed())
	// Output:
	// true
	// pulled 2 blocks, 3670016 bytes
	// layer 27 V
	// held on P: 0 freed: 2
}

// A prefill role with a prefix cache and vLLM's KV events: a second prompt that starts with the first one's
// full blocks reuses them, and its fill writes only the blocks after them. A KV-aware router subscribed to
// KVEventsAddr learns which blocks the worker holds.
func ExamplePrefill_HoldTokens() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	lib, err := nixl.Load(nixl.LoadOptions{})
	if err != nil {
		fmt.Println(err)
		return
	}
	qwen := connector.Model{Name: "Qwen/Qwen3-0.6B", Layers: 28, KVHeads: 8, HeadDim: 128, DType: layout.BF16}
	seed := "0" // the vLLM engines' PYTHONHASHSEED, so that block hashes agree
	pre, err := connector.NewPrefill(connector.PrefillConfig{
		RoleConfig:  connector.RoleConfig{VLLMVersion: "0.33.0", Model: qwen, NumBlocks: 64, Library: lib},
		PrefixCache: &connector.PrefixCacheConfig{PythonHashSeed: &seed},
		KVEvents:    &connector.KVEventsConfig{Addr: "127.0.0.1:0"},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pre.Close()

	prompt := make([]int64, 40) // 16-token blocks: 2 full blocks and 8 tokens
	for i := range prompt {
		prompt[i] = int64(1000 + i)
	}
	fill := func(_ context.Context, blocks []int, from int) error {
		fmt.Printf("fill %d blocks from block %d\n", len(blocks), from) // write the KV of blocks[from:]
		return nil
	}
	first, err := pre.HoldTokens(ctx, "req-1", prompt, "", fill)
	if err != nil {
		fmt.Println(err)
		return
	}
	pre.Abort("req-1") // as if its decode peer had read it: its full blocks stay cached
	second, err := pre.HoldTokens(ctx, "req-2", append(prompt[:32:32], 7, 8, 9), "", fill)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(first.RemotePrefillCachedTokens, second.RemotePrefillCachedTokens, pre.KVEventsAddr() != nil)
	// Output:
	// fill 3 blocks from block 0
	// fill 3 blocks from block 2
	// 0 32 true
}
