// Package sidechannel is vLLM NixlConnector's ZMQ side channel, in pure Go (no libzmq): a prefill-side ROUTER
// Server that serves each (pp, tp) rank's handshake payload, and a decode-side REQ client (Fetch, FetchAll)
// with per-attempt timeouts and bounded retries. Framing (H2 request [bin tag, tp]; H4 request [bin tag, pp,
// tp] and a second clock frame in the reply) comes from the protocol.Profile.
//
// The wire protocol is ZMTP 3.1 with the NULL security mechanism (rfc.zeromq.org 37/ZMTP; 3.0 peers are
// accepted too), implemented in an internal package and tested against libzmq through pyzmq, the library
// vLLM uses, both ways.
//
//	srv, err := sidechannel.NewServer(ctx, p, sidechannel.ServerConfig{Port: 5600,
//		Payloads: map[protocol.Rank][]byte{{PP: 0, TP: 0}: payload}})
//	defer srv.Close()
//	res, err := sidechannel.Fetch(ctx, p, "10.0.0.5:5600", protocol.Rank{}, sidechannel.FetchOptions{})
//
// Bad peers: the Server bounds what each peer can cost (ServerConfig: MaxConnections, MaxConnectionsPerHost,
// MaxQueuedReplies, RequestRate, HandshakeTimeout, IdleTimeout, WriteTimeout, SendBufferSize,
// MaxRequestSize), forgets a peer entirely when it leaves, rate-limits its log lines about bad input, and
// counts all of it in Stats. Replies share the served payload instead of copying it per peer.
//
// Concurrency: a Server runs a goroutine per connection (two after its handshake); its methods are safe for
// concurrent use. Each Fetch/FetchAll call uses its own connection on the calling goroutine, so calls may run
// concurrently. Server.Close and Fetch's return leave no goroutine or connection behind.
package sidechannel

// ZMTPVersion is the ZMQ wire protocol the side channel speaks.
const ZMTPVersion = "ZMTP 3.1"
