package sidechannel_test

import (
	"context"
	"fmt"

	"github.com/gonixl/gonixl/connector/protocol"
	"github.com/gonixl/gonixl/connector/sidechannel"
)

// A prefill-side server for two TP ranks and a decode-side fetch of rank 1, on loopback.
func ExampleNewServer() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	p, _ := protocol.ProfileByName("0.33")

	payloads := map[protocol.Rank][]byte{}
	for tp := 0; tp < 2; tp++ {
		m := protocol.NewAgentMetadata()
		m.EngineID = "prefill-engine"
		m.AgentMetadata = []byte(fmt.Sprintf("agent-%d", tp))
		b, err := p.EncodeHandshake("hash", m)
		if err != nil {
			panic(err)
		}
		payloads[protocol.Rank{TP: tp}] = b
	}
	srv, err := sidechannel.NewServer(ctx, p, sidechannel.ServerConfig{Port: 0, Payloads: payloads})
	if err != nil {
		panic(err)
	}
	defer srv.Close()

	res, err := sidechannel.Fetch(ctx, p, srv.Addr(), protocol.Rank{TP: 1}, sidechannel.FetchOptions{})
	if err != nil {
		panic(err)
	}
	m, err := p.OpenHandshake(res.Payload, protocol.HandshakeCheck{LocalHash: "hash", EnforceHash: true,
		ExpectedEngineID: "prefill-engine"})
	fmt.Println(string(m.AgentMetadata), res.HasClock, err)
	// Output: agent-1 true <nil>
}
