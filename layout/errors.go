package layout

import "errors"

// Sentinel errors. Every error this package returns wraps one of them, so callers can use errors.Is.
var (
	// ErrInvalidGeometry: a Geometry (or a source shape) has a zero/negative/unknown field, or its sizes
	// overflow or exceed the package limits.
	ErrInvalidGeometry = errors.New("layout: invalid geometry")
	// ErrBlockOutOfRange: a block id is negative or ≥ NumBlocks. With region-major descriptor indices such
	// an id would silently alias into the next region, so it is always refused.
	ErrBlockOutOfRange = errors.New("layout: block id out of range")
	// ErrNullBlock: block id 0 is vLLM's reserved null block and never holds request data.
	ErrNullBlock = errors.New("layout: block id 0 is the reserved null block")
	// ErrDuplicateBlock: the same block id appears twice in one request.
	ErrDuplicateBlock = errors.New("layout: duplicate block id")
	// ErrTooFewBlocks: a request's tokens need more blocks than were assigned.
	ErrTooFewBlocks = errors.New("layout: too few blocks for the token count")
	// ErrSizeMismatch: a buffer's length differs from what the geometry/shape requires.
	ErrSizeMismatch = errors.New("layout: buffer size mismatch")
	// ErrOutOfBounds: a batch row, token count, head or layer index lies outside the source or geometry.
	ErrOutOfBounds = errors.New("layout: index out of bounds")
	// ErrBlockLenMismatch: the peer's block_lens do not match this geometry (dtype, heads or block size differ).
	ErrBlockLenMismatch = errors.New("layout: block length mismatch with peer")
	// ErrIncompatible: two geometries cannot be paired (heterogeneous TP or block-size ratio not supported).
	ErrIncompatible = errors.New("layout: incompatible geometries")
	// ErrUnsupportedLayout: a block format gonixl names but does not model (CPU_ATTN's AMX packing, an fp8
	// CPU_ATTN cache, CPU_ATTN in PlanKVHalves), or an operation a format does not support; refused rather
	// than moving bytes that mean something else.
	ErrUnsupportedLayout = errors.New("layout: block layout not modelled")
)
