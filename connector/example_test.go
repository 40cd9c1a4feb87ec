package connector_test

import (
	"bytes"
	"context"
	"fmt"
	"time"

	"github.com/gonixl/gonixl/connector"
	"github.com/gonixl/gonixl/connector/protocol"
	"github.com/gonixl/gonixl/layout"
	"github.com/gonixl/gonixl/nixl"
)

// A prefill role and a decode role in one process, each with its own DRAM cache and NIXL agent, move one
// request the way vLLM's NixlConnector does: P fills the blocks and returns kv_transfer_params; D handshakes
// over the ZMQ side channel, READs the blocks over UCX with the notification that frees them on P.
func Example() {
	lib, err := nixl.Load(nixl.LoadOptions{}) // $NIXL_LIB_DIR, the loader's path, then the standard prefixes
	if err != nil {
		fmt.Println(err)
		return
	}
	p, _ := protocol.ProfileFor("0.16.0") // the vLLM version of the peers
	plan, _ := connector.PlanFor(p)
	g := layout.Geometry{NumLayers: 2, NumBlocks: 16, BlockSize: 16, NumKVHeads: 2, HeadDim: 64,
		DType: layout.BF16, Order: layout.HND, Plan: plan}
	compat := connector.Compat{CompatInputs: protocol.CompatInputs{VLLMVersion: "0.16.0", Model: "example/tiny",
		Dtype: "torch.bfloat16", NumKVHeads: 2, HeadSize: 64, NumHiddenLayers: 2, AttnBackendName: "FLASH_ATTN",
		CacheDtype: "auto"}}

	pcache, _ := connector.NewDRAMCache(g, false)
	defer pcache.Close()
	dcache, _ := connector.NewDRAMCache(g, false)
	defer dcache.Close()

	pre, err := connector.NewPrefill(connector.PrefillConfig{Profile: p, Library: lib, Cache: pcache, Compat: compat,
		EngineID: "example-prefill"})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pre.Close()
	dec, err := connector.NewDecode(connector.DecodeConfig{Profile: p, Library: lib, Cache: dcache, Compat: compat})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer dec.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Prefill: 20 tokens → 2 blocks; the fill function puts the KV there (here: a marker in every region).
	kv, err := pre.Prefill(ctx, "cmpl-1", 20, func(_ context.Context, blocks []int) error {
		for r := 0; r < g.NumRegions(); r++ {
			copy(pcache.Region(r)[int64(blocks[0])*g.BlockLen():], fmt.Sprintf("layer %d %s", r/2, "KV"[r%2:r%2+1]))
		}
		return nil
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	raw, _ := p.EncodeParams(kv) // what P's HTTP response carries; the proxy hands it to D
	fmt.Println(bytes.Contains(raw, []byte(`"remote_engine_id": "example-prefill"`)))

	// Decode: read P's blocks into local blocks 5 and 6.
	res, err := dec.Pull(ctx, "cmpl-1-decode", kv, []int{5, 6})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("pulled %d blocks, %d bytes\n", res.Blocks, res.Bytes)
	fmt.Println(string(bytes.TrimRight(dcache.Region(3)[5*g.BlockLen():5*g.BlockLen()+16], "\x00")))

	// P frees the blocks once D's notification arrives.
	for pre.Held() > 0 && ctx.Err() == nil {
		time.Sleep(time.Millisecond)
	}
	fmt.Println("held on P:", pre.Held(), "freed:", pre.Metrics().BlocksFreed.Load())
	// Output:
	// true
	// pulled 2 blocks, 32768 bytes
	// layer 1 V
	// held on P: 0 freed: 2
}
