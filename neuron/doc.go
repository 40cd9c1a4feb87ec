// Package neuron is gonixl's AWS Neuron (Trainium/Inferentia) backend: a libnrt binding loaded with dlopen,
// and a Stager that copies a prefill request's KV cache from NxDI's device tensors into a pinned host arena
// registered with NIXL as DRAM, at the block ids the scheduler assigned and in the layout the decode peer
// expects, so that a vLLM NixlConnector decode peer can READ it.
//
// # libnrt
//
// Load loads libnrt.so.1 — from LoadOptions.Path, else $GONIXL_NRT_LIB, else the loader path, else
// StandardPaths (/opt/aws/neuron/lib/libnrt.so.1) — resolves the C functions (declared in this package; no
// Neuron SDK is needed to build) and calls nrt_init. Optional functions (nrt_tensor_read_batch,
// nrt_get_status_as_str) are used when present. NRT_STATUS codes become *Error values — the C function, the
// status (Code) with its C name, the runtime's description (nrt_get_status_as_str, when present) and a hint —
// matching sentinels such as ErrTimeout or ErrResource with errors.Is. Calls refused before libnrt
// (ErrBadArgument, ErrTooLarge, ErrClosed, ...) are *Error too, with Native false, and keep layout's error as
// their Cause when layout refused a geometry or block ids. Every error of the package is an *Error or wraps
// one, except Load's *LoadError, the layout error of Stager.Descs, NewStager's wrap of the arena's *nixl.Error
// and Stage's wraps of what a Source or layout's conversion returned. *Error is the one error shape of nixl,
// cuda and neuron (each over its own codes).
//
// The Neuron runtime gives one process exclusive use of its NeuronCores: a core claimed by nrt_init in one
// process cannot be used by another, so a separate Go process can never read the KV tensors of a
// vLLM/NxDI process. Either the Go program is the process that owns the device tensors (stage them with
// NewDeviceSource), or it is handed host copies of the BHSD tensors (NewHostSource). The Stager reads from
// either through the Source interface.
//
// # Staging
//
// NewStager allocates one page-aligned host arena (mmap; mlock per StagerConfig.Lock; huge pages when
// available) sized from the layout.Geometry — NumBlocks taken from, and checked against, the scheduler's
// block pool — and refuses absurd sizes. Its regions sit back
// to back in the geometry's region order; RegionBases, Geometry, MemType (DRAM) and DeviceID (0, vLLM's
// device "cpu") are the handshake inputs, and never change while the Stager lives.
//
// Stage(ctx, req) copies one request's KV (every layer, K and V) from the Source into the arena at the block
// ids the scheduler assigned, in the peer's order (NHD or HND) and region plan, using layout's converter. The
// 2·NumLayers (layer, K|V) units run over a worker pool, so the device reads of one unit overlap the layout
// work of another; each unit's device reads are one native call. Stage returns only once every block is
// complete. Fill(row, tokens) is the same as a connector.FillFunc.
//
// A Stager is a cache plus a fill function, nothing more: the connector's prefill role registers the arena
// with NIXL (as any DRAM cache), allocates the block ids, calls Fill, and holds the blocks for the decode
// peer until its notification or the profile's lease / abort timeout — one pool, one clock, one registrar.
//
// # Testing without hardware
//
// Package neurontest builds a fake libnrt: a small C library implementing the used part of the libnrt API
// over host memory (several NeuronCores, tracked allocations, DMA alignment/granularity/maximum-transfer
// constraints, counters and fault injection). It is loaded through the same dlopen path as the real runtime;
// the tests and the demo use it when no Neuron device is present.
package neuron

//go:generate go tool stringer -linecomment -output=string.go -type=Placement
