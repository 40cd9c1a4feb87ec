// Package protocol is the pure-Go wire protocol of vLLM's NixlConnector (pull mode): version profiles, the
// side-channel request/reply framing, the handshake objects (NixlAgentMetadata, NixlHandshakePayload) encoded
// byte-for-byte as msgspec encodes them, the compatibility hash, kv_transfer_params and NIXL notification
// messages.
//
// Everything that differs between vLLM releases is data in a Profile (see Profiles); pick one with ProfileFor
// from the version string the peer's OpenAI server reports at GET /version, or with ProfileByName:
//
//	p, err := protocol.ProfileFor("0.33.0")
//	hash, err := p.CompatHash(protocol.CompatInputs{VLLMVersion: "0.33.0", Model: "Qwen/Qwen3-0.6B", ...})
//	payload, err := p.EncodeHandshake(hash, meta)          // prefill side: what the side channel serves
//	meta, err := p.OpenHandshake(payload, protocol.HandshakeCheck{LocalHash: hash, EnforceHash: true})
//
// Supported: vLLM 0.16.x (framing H2, payload M1, connector version 2) and 0.33.x (framing H4, payload M1,
// connector version 15). Decoders never panic on network input and return errors wrapping the package's
// sentinels (ErrMalformed, ErrMissingField, ErrHashMismatch, ...).
//
// Concurrency: Profiles and all values here are plain data; every function is safe for concurrent use.
// The package builds with CGO_ENABLED=0.
package protocol
