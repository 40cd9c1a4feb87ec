// Package sidechannel is vLLM NixlConnector's ZMQ side channel over real libzmq: a prefill-side ROUTER Server
// that serves each (pp, tp) rank's handshake payload, and a decode-side REQ client (Fetch, FetchAll) with
// per-attempt timeouts and bounded retries. Framing (H2 request [bin tag, tp]; H4 request [bin tag, pp, tp]
// and a second clock frame in the reply) comes from the protocol.Profile.
//
//	srv, err := sidechannel.NewServer(ctx, p, sidechannel.ServerConfig{Port: 5600,
//		Payloads: map[protocol.Rank][]byte{{PP: 0, TP: 0}: payload}})
//	defer srv.Close()
//	res, err := sidechannel.Fetch(ctx, p, "10.0.0.5:5600", protocol.Rank{}, sidechannel.FetchOptions{})
//
// Concurrency: a Server's socket is owned by one goroutine locked to its OS thread; its methods are safe for
// concurrent use. Each Fetch/FetchAll call uses its own ZMQ context and socket on the calling goroutine, so
// calls may run concurrently. Server.Close and Fetch's return leave no goroutine or socket behind.
package sidechannel
