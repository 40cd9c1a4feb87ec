package protocol_test

import (
	"fmt"

	"github.com/gonixl/gonixl/connector/protocol"
	"github.com/gonixl/gonixl/layout"
)

// Pick the profile from the version string the vLLM peer reports at GET /version.
func ExampleProfileFor() {
	p, err := protocol.ProfileFor("0.33.0")
	if err != nil {
		panic(err)
	}
	fmt.Println(p)
	p, _ = protocol.ProfileFor("0.24.0") // one row serves 0.23.0 up to 0.25.x
	fmt.Println(p, p.Layout)
	_, err = protocol.ProfileFor("0.34.0")
	fmt.Println(err)
	// Output:
	// vLLM 0.33 (H4, connector v15)
	// vLLM 0.23 (H2, connector v4) B
	// protocol: no profile for this vLLM version: vLLM "0.34.0" (supported: 0.16.x–0.17.x, 0.18.x–0.19.x, 0.20.x, 0.21.x, 0.22.x, 0.23.x–0.25.x, 0.26.x–0.27.x, 0.28.x, 0.29.x, 0.30.x, 0.31.x, 0.32.x, 0.33.x)
}

// Reproduce the compatibility hash a vLLM 0.16.0 decode instance computes for Qwen3-0.6B.
func ExampleProfile_CompatHash() {
	p, _ := protocol.ProfileByName("0.16")
	h, err := p.CompatHash(protocol.CompatInputs{
		VLLMVersion: "0.16.0", Model: "Qwen/Qwen3-0.6B", Dtype: "torch.bfloat16",
		NumKVHeads: 8, HeadSize: 128, NumHiddenLayers: 28,
		AttnBackendName: "FLASH_ATTN", CacheDtype: "auto",
	})
	if err != nil {
		panic(err)
	}
	fmt.Println(h)
	// Output: dbb2848cbaefc84f6db09834b6d47a09b8266fec2abb3dbbba3c3f553be60df9
}

// The prefill side encodes its handshake payload; the decode side opens it with vLLM's checks.
func ExampleProfile_OpenHandshake() {
	p, _ := protocol.ProfileByName("0.33")
	m := protocol.NewAgentMetadata()
	m.EngineID = "prefill-0"
	m.AgentMetadata = []byte("nixl agent blob")
	m.KVCachesBaseAddr = []uint64{0x7f0000000000}
	m.BlockLens, m.BlockStrides = []int64{32768}, []int64{32768}
	m.NumBlocks, m.BlockSize, m.KVCacheLayout, m.AttnBackendName = 1024, 16, "HND", "FLASH_ATTN"

	payload, err := p.EncodeHandshake("hash", m)
	if err != nil {
		panic(err)
	}
	got, err := p.OpenHandshake(payload, protocol.HandshakeCheck{LocalHash: "hash", EnforceHash: true, ExpectedEngineID: "prefill-0"})
	fmt.Println(got.EngineID, got.NumBlocks, err)
	_, err = p.OpenHandshake(payload, protocol.HandshakeCheck{LocalHash: "other", EnforceHash: true})
	fmt.Println(err != nil)
	// Output:
	// prefill-0 1024 <nil>
	// true
}

// Transfer notifications and heartbeats, per profile.
func ExampleProfile_EncodeNotification() {
	p, _ := protocol.ProfileByName("0.33")
	b, _ := p.EncodeNotification(protocol.Notification{RequestID: "cmpl-8f0c-0-1a2b3c4d", Count: 1})
	fmt.Println(string(b))
	hb, _ := p.EncodeHeartbeat([]string{"reqA", "reqB"})
	fmt.Println(string(hb))
	n, _ := p.DecodeNotification(hb)
	fmt.Println(n.IsHeartbeat(), n.Heartbeat)
	// Output:
	// cmpl-8f0c-0-1a2b3c4d:1
	// HB:reqA,reqB
	// true [reqA reqB]
}

// Name the vLLM version (once, to ProfileFor), the peer's platform and the model; the rest is vLLM's defaults
// for that release. This is the hash vLLM 0.33.0's own NixlConnector computed on its CPU platform for this
// model path (testdata/vllm/0.33.0/real.json).
func ExampleProfile_DefaultCompatInputs() {
	p, _ := protocol.ProfileFor("0.33.0")
	in := p.DefaultCompatInputs(protocol.PlatformCPU)
	in.Model, in.Dtype, in.NumKVHeads, in.HeadSize, in.NumHiddenLayers = "/tmp/gonixl-vectors/Qwen3-0.6B", "torch.bfloat16", 8, 128, 28
	h, _ := p.CompatHash(in)
	js, _ := p.FactorsJSON(in)
	fmt.Println(h)
	fmt.Println(js)
	// Output:
	// 2d8da8e0df0904611923335cad81e46a9114503c6e2d960994864ca23c9f5984
	// {"attn_backend_name": "CPU_ATTN", "cache_dtype": "auto", "dtype": "torch.bfloat16", "head_size": 128, "is_hma_enabled": true, "model": "/tmp/gonixl-vectors/Qwen3-0.6B", "nixl_connector_version": 15, "num_hidden_layers": 28, "num_kv_heads": 8, "speculative_config": null, "transfer_mode": "pull", "vllm_version": "0.33.0"}
}

// Each row names the block orders as its vLLM release does; vLLM compares the names exactly.
func ExampleProfile_ParseLayoutName() {
	for _, v := range []string{"0.16.0", "0.33.0"} {
		p, _ := protocol.ProfileFor(v)
		name, _ := p.LayoutName(layout.HND)
		o, _ := p.ParseLayoutName(name)
		_, err := p.ParseLayoutName("HND")
		fmt.Println(v, name, o, err == nil)
	}
	// Output:
	// 0.16.0 HND HND true
	// 0.33.0 LBHNC HND false
}
