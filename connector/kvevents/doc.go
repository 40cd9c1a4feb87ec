// Package kvevents publishes vLLM-format KV-cache events in pure Go, so that a router that consumes vLLM's
// events (NVIDIA Dynamo's KV router, vLLM's own subscribers) can follow a gonixl prefill worker's cache.
//
// It is vLLM's ZmqEventPublisher (vllm/distributed/kv_events.py) on the wire:
//
//   - A ZMQ PUB socket (ZMTP 3.x, pure Go) sends each batch as three frames: the topic, the batch's sequence
//     number as 8 bytes big-endian (0, 1, 2, ... per publisher), and the msgpack KVEventBatch. Subscribers
//     choose topics by prefix (SUBSCRIBE/CANCEL, as with libzmq's SUB sockets); an empty subscription matches
//     everything.
//   - An optional ROUTER socket answers replay requests: a DEALER (or REQ) sends [b"", start sequence as 8
//     bytes big-endian] and gets every buffered batch from there on, one message each, then an end marker
//     (sequence -1 and an empty payload). Up to 0.20 a replayed message is [b"", seq, payload] and the end
//     marker [b"", -1, b""]; from 0.26 [b"", topic, seq, payload] and [b"", b"", -1, b""] (Format.ReplayTopic).
//   - The batch and its events are encoded exactly as msgspec encodes vLLM's structs for the consumer's
//     release (Format, FormatFor): KVEventBatch [ts, events, data_parallel_rank]; BlockStored (block hashes,
//     parent hash, token ids, block size, LoRA, medium, and the fields later releases added), BlockRemoved,
//     AllBlocksCleared, as tagged arrays (0.16, 0.20) or tagged maps with omitted defaults (from 0.26).
//
// Publish never blocks on the network and memory stays bounded: the last Config.BufferSteps batches are kept
// for replay, and each subscriber has a queue bounded by messages (HWM, like ZMQ's) and bytes; a subscriber
// that falls behind misses messages (Stats.Dropped), sees the gap in the sequence numbers, and fetches them
// through replay. Connections, subscriptions per subscriber and request sizes are bounded too, and nothing a
// peer sends can make the publisher panic. Stats and Collector (Prometheus) export the counters.
//
// The formats of vLLM 0.16, 0.20, 0.26, 0.29, 0.31, 0.32 and 0.33 have been read (Formats); FormatFor refuses the
// series between them until their rows are added. The tests check every format against vLLM itself:
// msgspec decodes what the publisher sends into vLLM's KVEventBatch, and vLLM's own ZmqEventPublisher, given
// the same batches, answers replay requests with the same frames.
//
// The package builds with CGO_ENABLED=0.
package kvevents
