package neuron

import (
	"strconv"
	"strings"

	"github.com/gonixl/gonixl/layout"
)

// SourceSpec describes NxDI's contiguous per-layer KV tensors: one K and one V tensor per layer, each shaped
// Shape = (B', H, S', D) with B' the cache batch rows, H the KV heads this rank holds, S' the cache length
// (take it from the real tensor: NxDI pads it) and D the head dim; K may be stored transposed (B', H, D, S').
// NxDI's tiled variant is a view of the same bytes as BHSD and needs no special case.
type SourceSpec struct {
	DType       layout.DType
	Shape       layout.Source // V's shape; K has the same dimensions
	KTransposed bool
	NumLayers   int
}

// shape returns the layout.Source describing kv's tensor.
func (s SourceSpec) shape(kv layout.KV) layout.Source {
	sh := s.Shape
	sh.Transposed = kv == layout.K && s.KTransposed
	return sh
}

// TensorBytes is the size in bytes of one per-layer K or V tensor.
func (s SourceSpec) TensorBytes() (int64, error) { return s.Shape.Bytes(s.DType.Size()) }

// validate refuses a spec that describes no tensor; op is the call that was given it.
func (s SourceSpec) validate(op string) error {
	if !s.DType.Valid() {
		return refuse(op, ErrBadArgument, "source dtype %v is not set", s.DType)
	}
	if s.NumLayers <= 0 || s.NumLayers > layout.MaxLayers {
		return refuse(op, ErrBadArgument, "source has %d layers, want 1..%d", s.NumLayers, layout.MaxLayers)
	}
	if s.Shape.Transposed {
		return refuse(op, ErrBadArgument, "set SourceSpec.KTransposed instead of Shape.Transposed (V is never transposed)")
	}
	if _, err := s.TensorBytes(); err != nil {
		return refuse(op, ErrBadArgument, "source shape: %w", err)
	}
	return nil
}

// Source is where a Stager reads KV from. The Neuron runtime gives one process exclusive use of its
// NeuronCores, so a source is either the device tensors this process owns (NewDeviceSource, read through
// libnrt) or host copies of the BHSD tensors handed in by the process that owns them (NewHostSource).
//
// Fetch copies what a request needs of one layer's K or V tensor into dst (len(dst) ≥ FetchLen) and returns
// the shape of what it wrote there, as a layout.Source with one batch row (row 0) and heads
// [0, heads): for BHSD tensors the first tokens positions of heads [firstHead, firstHead+heads) of row row;
// for transposed K the whole (D, S') planes of those heads. Fetch must be safe for concurrent calls on
// different (layer, kv) pairs and different dst.
type Source interface {
	Spec() SourceSpec
	Fetch(layer int, kv layout.KV, row, firstHead, heads, tokens int, dst []byte) (layout.Source, error)
}

// run is one contiguous copy of a fetch: n bytes from the source tensor at src to dst offset dst.
type run struct{ src, dst, n int64 }

// fetchPlan computes the compact shape and the contiguous runs that fetch (row, heads, tokens) of kv's
// tensor: one run per head, into a dst of dstLen bytes (checked to be large enough).
func fetchPlan(spec SourceSpec, layer int, kv layout.KV, row, firstHead, heads, tokens, dstLen int) (layout.Source, []run, error) {
	sh := spec.shape(kv)
	switch {
	case layer < 0 || layer >= spec.NumLayers:
		return layout.Source{}, nil, refuse("fetch", ErrBadArgument, "layer %d, source has %d layers", layer, spec.NumLayers)
	case kv != layout.K && kv != layout.V:
		return layout.Source{}, nil, refuse("fetch", ErrBadArgument, "%v is neither K nor V", kv)
	case row < 0 || row >= sh.Batch:
		return layout.Source{}, nil, refuse("fetch", ErrBadArgument, "batch row %d, source has %d rows", row, sh.Batch)
	case heads <= 0 || firstHead < 0 || firstHead+heads > sh.Heads:
		return layout.Source{}, nil, refuse("fetch", ErrBadArgument, "heads [%d, %d), source has %d", firstHead, firstHead+heads, sh.Heads)
	case tokens <= 0 || tokens > sh.SeqLen:
		return layout.Source{}, nil, refuse("fetch", ErrBadArgument, "%d tokens, source holds 1..%d positions", tokens, sh.SeqLen)
	}
	e := int64(spec.DType.Size())
	plane := int64(sh.SeqLen) * int64(sh.HeadDim) * e // one (b, h) plane of the tensor
	out := layout.Source{Batch: 1, Heads: heads, SeqLen: tokens, HeadDim: sh.HeadDim, Transposed: sh.Transposed}
	per := int64(tokens) * int64(sh.HeadDim) * e // BHSD: the first tokens positions of a head are contiguous
	if sh.Transposed {
		out.SeqLen = sh.SeqLen // positions are the fastest axis: take whole planes
		per = plane
	}
	runs := make([]run, heads)
	for h := range heads {
		runs[h] = run{src: (int64(row)*int64(sh.Heads) + int64(firstHead+h)) * plane, dst: int64(h) * per, n: per}
	}
	if need := runs[heads-1].dst + runs[heads-1].n; int64(dstLen) < need {
		return out, nil, refuse("fetch", ErrBadArgument, "fetch buffer of %d bytes, need %d", dstLen, need)
	}
	return out, runs, nil
}

// FetchLen is the largest dst a Fetch of tokens positions of heads heads needs for this spec.
func (s SourceSpec) FetchLen(heads, tokens int) int64 {
	e := int64(s.DType.Size())
	if s.KTransposed {
		tokens = max(tokens, s.Shape.SeqLen)
	}
	return int64(heads) * int64(tokens) * int64(s.Shape.HeadDim) * e
}

// perLayer is what DeviceSource and HostSource share: the spec and one K and one V tensor (T) per layer.
type perLayer[T any] struct {
	spec SourceSpec
	k, v []T
}

// Spec returns the source's shape description.
func (p *perLayer[T]) Spec() SourceSpec { return p.spec }

// plan is fetchPlan for a Fetch into dst, plus the tensor of (layer, kv) that the runs read.
func (p *perLayer[T]) plan(layer int, kv layout.KV, row, firstHead, heads, tokens int, dst []byte) (layout.Source, []run, T, error) {
	var t T
	sh, runs, err := fetchPlan(p.spec, layer, kv, row, firstHead, heads, tokens, len(dst))
	if err != nil {
		return sh, nil, t, err
	}
	t = p.k[layer]
	if kv == layout.V {
		t = p.v[layer]
	}
	return sh, runs, t, nil
}

// DeviceSource reads NxDI's KV tensors from Neuron device memory through libnrt: each Fetch is one native
// call (nrt_tensor_read_batch when available) carrying one read per head.
// Concurrency: safe for concurrent Fetch calls.
type DeviceSource struct {
	perLayer[*Tensor]
	rt *Runtime
}

// NewDeviceSource wraps one K and one V device tensor per layer (k[l], v[l]; NxDI's
// "kv_mgr.past_key_values.<2l>" and "<2l+1>"). Every tensor must be exactly spec's size. The tensors stay
// owned by the caller and must outlive the source.
func NewDeviceSource(spec SourceSpec, k, v []*Tensor) (*DeviceSource, error) {
	if err := spec.validate("new device source"); err != nil {
		return nil, err
	}
	if len(k) != spec.NumLayers || len(v) != spec.NumLayers {
		return nil, refuse("new device source", ErrBadArgument, "%d K and %d V tensors for %d layers", len(k), len(v), spec.NumLayers)
	}
	want, _ := spec.TensorBytes()
	var rt *Runtime
	for l := range spec.NumLayers {
		for _, t := range []*Tensor{k[l], v[l]} {
			if t == nil {
				return nil, refuse("new device source", ErrBadArgument, "layer %d has a nil tensor", l)
			}
			if t.Size() != uint64(want) {
				return nil, refuse("new device source", ErrBadArgument, "tensor %q of layer %d is %d bytes, shape (%d, %d, %d, %d) of %v needs %d",
					t.Name(), l, t.Size(), spec.Shape.Batch, spec.Shape.Heads, spec.Shape.SeqLen, spec.Shape.HeadDim, spec.DType, want)
			}
			if rt == nil {
				rt = t.rt
			} else if t.rt != rt {
				return nil, refuse("new device source", ErrBadArgument, "tensors of different Runtimes")
			}
		}
	}
	return &DeviceSource{perLayer: perLayer[*Tensor]{spec: spec, k: append([]*Tensor(nil), k...), v: append([]*Tensor(nil), v...)}, rt: rt}, nil
}

// Fetch reads the runs of one (layer, kv) with a single native batch call.
func (d *DeviceSource) Fetch(layer int, kv layout.KV, row, firstHead, heads, tokens int, dst []byte) (layout.Source, error) {
	sh, runs, t, err := d.plan(layer, kv, row, firstHead, heads, tokens, dst)
	if err != nil {
		return sh, err
	}
	ops := make([]Op, len(runs))
	for i, r := range runs {
		ops[i] = Op{Offset: uint64(r.src), Buf: dst[r.dst : r.dst+r.n]}
	}
	return sh, d.rt.ReadBatch([]Batch{{Tensor: t, Ops: ops}})
}

// HostSource serves host copies of NxDI's BHSD tensors (for a Go program that does not own the
// NeuronCores and is handed the KV by the process that does).
// Concurrency: safe for concurrent Fetch calls; the caller must not modify the buffers while staging.
type HostSource struct {
	perLayer[[]byte]
}

// NewHostSource wraps one K and one V host buffer per layer, each exactly spec's tensor size.
func NewHostSource(spec SourceSpec, k, v [][]byte) (*HostSource, error) {
	if err := spec.validate("new host source"); err != nil {
		return nil, err
	}
	if len(k) != spec.NumLayers || len(v) != spec.NumLayers {
		return nil, refuse("new host source", ErrBadArgument, "%d K and %d V buffers for %d layers", len(k), len(v), spec.NumLayers)
	}
	want, _ := spec.TensorBytes()
	for l := range spec.NumLayers {
		if int64(len(k[l])) != want || int64(len(v[l])) != want {
			return nil, refuse("new host source", ErrBadArgument, "layer %d buffers are %d and %d bytes, want %d", l, len(k[l]), len(v[l]), want)
		}
	}
	return &HostSource{perLayer[[]byte]{spec: spec, k: k, v: v}}, nil
}

// Fetch copies the runs of one (layer, kv).
func (h *HostSource) Fetch(layer int, kv layout.KV, row, firstHead, heads, tokens int, dst []byte) (layout.Source, error) {
	sh, runs, src, err := h.plan(layer, kv, row, firstHead, heads, tokens, dst)
	if err != nil {
		return sh, err
	}
	for _, r := range runs {
		copy(dst[r.dst:r.dst+r.n], src[r.src:r.src+r.n])
	}
	return sh, nil
}

// NxDIKVPrefix is the key prefix of NxDI's KV cache tensors in a traced model's state
// ("kv_mgr.past_key_values.<2·layer + c>", c = 0 for K and 1 for V).
const NxDIKVPrefix = "kv_mgr.past_key_values."

// NewDeviceSourceFromState builds a DeviceSource from one TP rank's NxDI state, keyed by tensor name. Only
// keys "…kv_mgr.past_key_values.<i>" are used (quantisation scales and other state are ignored); index 2l is
// layer l's K and 2l+1 its V. Every layer of spec must be present exactly once.
func NewDeviceSourceFromState(spec SourceSpec, state map[string]*Tensor) (*DeviceSource, error) {
	if spec.NumLayers <= 0 || spec.NumLayers > layout.MaxLayers {
		return nil, refuse("new device source from state", ErrBadArgument, "source has %d layers, want 1..%d", spec.NumLayers, layout.MaxLayers)
	}
	k := make([]*Tensor, spec.NumLayers)
	v := make([]*Tensor, spec.NumLayers)
	for name, t := range state {
		i := strings.LastIndex(name, NxDIKVPrefix)
		if i < 0 {
			continue
		}
		idx, err := strconv.Atoi(name[i+len(NxDIKVPrefix):])
		if err != nil {
			continue // e.g. "...past_key_values.3.scale"
		}
		if idx < 0 || idx >= 2*spec.NumLayers {
			return nil, refuse("new device source from state", ErrBadArgument, "state key %q is beyond the %d layers of the source", name, spec.NumLayers)
		}
		dst := &k[idx/2]
		if idx%2 == 1 {
			dst = &v[idx/2]
		}
		if *dst != nil {
			return nil, refuse("new device source from state", ErrBadArgument, "state has two tensors for %s%d", NxDIKVPrefix, idx)
		}
		*dst = t
	}
	for l := range spec.NumLayers {
		if k[l] == nil || v[l] == nil {
			return nil, refuse("new device source from state", ErrBadArgument, "state lacks %s%d or %s%d (layer %d)", NxDIKVPrefix, 2*l, NxDIKVPrefix, 2*l+1, l)
		}
	}
	return NewDeviceSource(spec, k, v)
}
