// Package layout is gonixl's pure-Go model of a paged KV cache as vLLM's NixlConnector sees it: geometry
// and byte sizes, converters between NxDI's contiguous per-layer tensors and vLLM's paged blocks, and the
// descriptor math (addresses and region-major descriptor indices) that both peers of a transfer must agree on.
//
// It imports nothing of gonixl's, allocates nothing on its hot paths, and builds with CGO_ENABLED=0.
package layout
