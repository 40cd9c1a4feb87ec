package layout

import (
	"fmt"
	"slices"
)

// MaxTP is the largest tensor-parallel degree accepted (far above any deployment); it keeps every rank
// and head computation of this file far from overflow.
const MaxTP = 1 << 16

// HeadsPerRank is the number of KV heads each of tp ranks holds for a model with totalKVHeads KV heads,
// following NxDI's REPLICATE_TO_TP_DEGREE and vLLM: totalKVHeads/tp when tp divides it, 1 (replicated)
// when tp > totalKVHeads and totalKVHeads divides tp. Other combinations, tp > MaxTP and more than
// MaxKVHeads heads per rank are refused.
func HeadsPerRank(totalKVHeads, tp int) (int, error) {
	// (totalKVHeads-1)/tp ≥ MaxKVHeads is totalKVHeads > MaxKVHeads·tp without the product, which could wrap.
	if totalKVHeads <= 0 || tp <= 0 || tp > MaxTP || (totalKVHeads-1)/tp >= MaxKVHeads {
		return 0, fmt.Errorf("%w: %d KV heads over TP %d", ErrInvalidGeometry, totalKVHeads, tp)
	}
	if tp <= totalKVHeads {
		if totalKVHeads%tp != 0 {
			return 0, fmt.Errorf("%w: %d KV heads do not split evenly over TP %d", ErrIncompatible, totalKVHeads, tp)
		}
		return totalKVHeads / tp, nil
	}
	if tp%totalKVHeads != 0 {
		return 0, fmt.Errorf("%w: TP %d is not a multiple of %d KV heads (NxDI would convert to MHA)", ErrIncompatible, tp, totalKVHeads)
	}
	return 1, nil
}

// RankHeads returns the global KV heads [first, first+n) held by rank of a tp-way sharded model: heads
// [rank·H/tp, (rank+1)·H/tp) when tp ≤ H, the single replicated head rank·H/tp (= rank // (tp/H)) when tp > H.
// Pass first as Seq.FirstHead to convert a rank's slice out of a tensor that holds all heads.
func RankHeads(totalKVHeads, tp, rank int) (first, n int, err error) {
	n, err = HeadsPerRank(totalKVHeads, tp)
	if err != nil {
		return 0, 0, err
	}
	if rank < 0 || rank >= tp {
		return 0, 0, fmt.Errorf("%w: rank %d of TP %d", ErrOutOfBounds, rank, tp)
	}
	// rank·totalKVHeads/tp without the product: tp divides totalKVHeads, or totalKVHeads divides tp.
	if tp <= totalKVHeads {
		return rank * n, n, nil
	}
	return rank / (tp / totalKVHeads), n, nil
}

// ReadPlan is one decode (local, D) rank's view of reading from a prefill (remote, P) engine, following
// vLLM's NixlConnector (add_remote_agent / _read_blocks in 0.16.x, compute_tp_mapping / _build_fa_remote
// in 0.33.x): which P ranks to read, the descriptor lists on both sides, and the descriptor indices of a
// request. It covers homogeneous TP, D_tp > P_tp (D reads its head slice of a P block), P_tp > D_tp (D's
// block is filled in chunks from several P ranks) and a block-size ratio r = D_bs / P_bs ≥ 1.
//
// A ReadPlan is immutable after NewReadPlan and safe for concurrent use.
type ReadPlan struct {
	Local, Remote                            Geometry
	LocalTP, LocalRank, RemoteTP, TotalHeads int

	ratio        int   // D_bs / P_bs
	sources      []int // P ranks read, in slot order
	offsetFactor int   // head-slice offset inside a P block, in units of D's per-rank kv block
	whole        bool  // one descriptor per whole block (Merged), not one per K/V half
}

// NewReadPlan checks that local (D's rank localRank of localTP) can read remote (a P engine of remoteTP
// ranks) for a model with totalKVHeads KV heads, and precomputes the mapping. Both geometries must share
// plan, dtype, head_dim, layer count and block order (vLLM refuses mismatched kv_cache_layout); each side's
// NumKVHeads must be HeadsPerRank of its TP; D's block size must be a multiple of P's; with P_tp > D_tp the
// block sizes must be equal. Violations wrap ErrIncompatible (or ErrBlockLenMismatch for head counts).
func NewReadPlan(local Geometry, localTP, localRank int, remote Geometry, remoteTP, totalKVHeads int) (*ReadPlan, error) {
	if err := local.Validate(); err != nil {
		return nil, fmt.Errorf("local: %w", err)
	}
	if err := remote.Validate(); err != nil {
		return nil, fmt.Errorf("remote: %w", err)
	}
	if local.Plan != remote.Plan || local.DType != remote.DType || local.HeadDim != remote.HeadDim ||
		local.NumLayers != remote.NumLayers {
		return nil, fmt.Errorf("%w: local %v vs remote %v: plan, dtype, head_dim and layers must match", ErrIncompatible, local, remote)
	}
	if local.Order != remote.Order {
		return nil, fmt.Errorf("%w: local order %v vs remote %v (vLLM: \"Heterogeneous TP expects same kv_cache_layout\")",
			ErrIncompatible, local.Order, remote.Order)
	}
	if localRank < 0 || localRank >= localTP {
		return nil, fmt.Errorf("%w: local rank %d of TP %d", ErrOutOfBounds, localRank, localTP)
	}
	hl, err := HeadsPerRank(totalKVHeads, localTP)
	if err != nil {
		return nil, fmt.Errorf("local: %w", err)
	}
	hr, err := HeadsPerRank(totalKVHeads, remoteTP)
	if err != nil {
		return nil, fmt.Errorf("remote: %w", err)
	}
	if local.NumKVHeads != hl || remote.NumKVHeads != hr {
		return nil, fmt.Errorf("%w: heads per rank local %d (want %d for TP %d), remote %d (want %d for TP %d)",
			ErrBlockLenMismatch, local.NumKVHeads, hl, localTP, remote.NumKVHeads, hr, remoteTP)
	}
	if local.Order.IsCPUAttn() && local.BlockSize != remote.BlockSize {
		// K is transposed per head ([head_dim][block_size]): a smaller remote block is not a contiguous run.
		return nil, fmt.Errorf("%w: CPU_ATTN blocks of %d and %d tokens: the CPU_ATTN layout needs equal block sizes", ErrIncompatible,
			local.BlockSize, remote.BlockSize)
	}
	if hl != hr && local.Order != HND && !local.Order.IsCPUAttn() {
		// A rank's heads are a contiguous slice of a block only when heads are outermost.
		return nil, fmt.Errorf("%w: local TP %d and remote TP %d hold different heads per rank (%d vs %d), which needs heads outermost in a block, HND or CPU_ATTN, on both sides (got %v); vLLM requires kv_cache_layout HND for heterogeneous TP",
			ErrIncompatible, localTP, remoteTP, hl, hr, local.Order)
	}
	if local.BlockSize%remote.BlockSize != 0 {
		return nil, fmt.Errorf("%w: local block size %d is not a multiple of remote %d (vLLM rejects P_bs > D_bs)",
			ErrIncompatible, local.BlockSize, remote.BlockSize)
	}
	p := &ReadPlan{Local: local, Remote: remote, LocalTP: localTP, LocalRank: localRank, RemoteTP: remoteTP,
		TotalHeads: totalKVHeads, ratio: local.BlockSize / remote.BlockSize}
	if n, ok := mulChecked(int64(local.NumDescs()), int64(p.ratio)); !ok || n > MaxDescs {
		return nil, fmt.Errorf("%w: %d local descriptors × block size ratio %d exceeds %d descriptors (remote block size %d is too small)",
			ErrIncompatible, local.NumDescs(), p.ratio, int64(MaxDescs), remote.BlockSize)
	}
	if localTP >= remoteTP {
		if localTP%remoteTP != 0 {
			return nil, fmt.Errorf("%w: local TP %d is not a multiple of remote TP %d", ErrIncompatible, localTP, remoteTP)
		}
		p.sources = []int{localRank * remoteTP / localTP}
		p.offsetFactor = headOffset(localRank, localTP, remoteTP, totalKVHeads)
	} else {
		if remoteTP%localTP != 0 {
			return nil, fmt.Errorf("%w: remote TP %d is not a multiple of local TP %d", ErrIncompatible, remoteTP, localTP)
		}
		if p.ratio != 1 {
			return nil, fmt.Errorf("%w: block sizes must match when remote TP %d > local TP %d", ErrIncompatible, remoteTP, localTP)
		}
		k := remoteTP / localTP
		seen := -1
		for i := range k {
			r := localRank*k + i
			if h := r * totalKVHeads / remoteTP; h != seen { // replicated P ranks: read each head once
				seen = h
				p.sources = append(p.sources, r)
			}
		}
	}
	return p, nil
}

// headOffset is vLLM 0.33's compute_head_offset: where D rank's heads start inside its source P block,
// in units of D's per-rank heads. (vLLM 0.16 used rank % (D_tp/P_tp) here, which differs only when D
// replicates heads that P does not; such a pairing reads the wrong head on 0.16.)
func headOffset(rank, tp, remoteTP, heads int) int {
	if tp <= remoteTP {
		return 0
	}
	if tp > heads {
		rr := rank * remoteTP / tp
		return rank*heads/tp - rr*heads/remoteTP
	}
	return rank % (tp / remoteTP)
}

// Merged returns the plan to use when the descriptor lists need not be vLLM's own, only wire-compatible
// (the prepared lists are local to the decode agent): in PlanKVHalves, where vLLM prepares two descriptors
// per block (the K half, then in a second pass the V half at +BlockLen/2), and D reads whole blocks (one
// source rank, no head offset, equal block sizes and lengths), its lists hold one descriptor per whole
// block instead, so that the descriptors of consecutive blocks are adjacent on both sides and NIXL's merge
// of adjacent descriptors (on unless nixl.WithoutDescMerge) posts one descriptor per region and run of
// consecutive block ids, half as many regions as vLLM's. Every other plan already has one descriptor per
// block (PlanSplitKV, PlanPackedKV) or descriptors that can never be adjacent (a head slice, chunks of
// several P ranks); for them Merged returns p. The bytes moved are the same either way.
func (p *ReadPlan) Merged() *ReadPlan {
	if p.whole || p.Local.Plan != PlanKVHalves || len(p.sources) != 1 || p.offsetFactor != 0 || p.ratio != 1 ||
		p.Local.BlockLen() != p.Remote.BlockLen() || p.xferLen() != uint64(p.Local.DescLen()) {
		return p
	}
	q := *p
	q.sources = slices.Clone(p.sources)
	q.whole = true
	return &q
}

// WholeBlocks reports whether the plan's lists hold one descriptor per whole block (see Merged).
func (p *ReadPlan) WholeBlocks() bool { return p.whole }

// descRegions is the number of descriptor regions of the plan's lists: the local geometry's, or its
// registered regions when the lists hold whole blocks.
func (p *ReadPlan) descRegions() int {
	if p.whole {
		return p.Local.NumRegions()
	}
	return p.Local.NumDescRegions()
}

// appendWholeBlocks appends one descriptor per block of every region: (base + b·BlockLen, BlockLen).
func appendWholeBlocks(dst []Desc, g Geometry, bases []uint64, devID uint64) []Desc {
	bl := uint64(g.BlockLen())
	for _, base := range bases {
		for b := range g.NumBlocks {
			dst = append(dst, Desc{Addr: base + uint64(b)*bl, Len: bl, DevID: devID})
		}
	}
	return dst
}

// BlockSizeRatio is D_bs / P_bs (1 when the block sizes match).
func (p *ReadPlan) BlockSizeRatio() int { return p.ratio }

// SourceRanks returns the P ranks this D rank reads, in slot order (a copy).
func (p *ReadPlan) SourceRanks() []int { return slices.Clone(p.sources) }

// HeadOffset is the byte offset of this D rank's head slice inside each remote K/V block (or half):
// factor · (D's per-rank kv block length / ratio). Zero unless D_tp > P_tp with distinct heads.
func (p *ReadPlan) HeadOffset() uint64 {
	return uint64(p.offsetFactor) * uint64(p.Local.DescLen()) / uint64(p.ratio)
}

// xferLen is the length of every descriptor on both sides: D's descriptor length, divided by the block
// size ratio and by the number of P ranks that fill one D block.
func (p *ReadPlan) xferLen() uint64 {
	return uint64(p.Local.DescLen()) / uint64(p.ratio) / uint64(len(p.sources))
}

// RemoteDescs returns the remote descriptor list for one source rank's kv_caches_base_addr, as vLLM
// prepares it (prep_xfer_dlist(remote_agent, ...)): per remote region, per remote block b (and in
// PlanKVHalves then per V half at +P_block_len/2): (base + b·P_block_len + HeadOffset, xfer length,
// devID). devID is the remote's advertised device_id.
func (p *ReadPlan) RemoteDescs(remoteBases []uint64, devID uint64) ([]Desc, error) {
	if err := p.Remote.checkBases(remoteBases); err != nil {
		return nil, fmt.Errorf("remote: %w", err)
	}
	if p.whole {
		return appendWholeBlocks(make([]Desc, 0, p.Remote.NumRegions()*p.Remote.NumBlocks), p.Remote, remoteBases, devID), nil
	}
	out := make([]Desc, 0, p.Remote.NumDescs())
	return appendBlockDescs(out, p.Remote, remoteBases, 1, p.HeadOffset(), p.xferLen(), 1, 0, devID), nil
}

// LocalDescs returns the local descriptor list to pair with reads from sourceRank: D's blocks split into
// ratio sub-blocks (stride BlockLen/ratio) and, when several P ranks fill one D block, cut to this source's
// chunk at +slot·length. With one source and ratio 1 it equals Local.Descs.
func (p *ReadPlan) LocalDescs(localBases []uint64, devID uint64, sourceRank int) ([]Desc, error) {
	slot := slices.Index(p.sources, sourceRank)
	if slot < 0 {
		return nil, fmt.Errorf("%w: rank %d is not a source of local rank %d (sources %v)", ErrOutOfBounds,
			sourceRank, p.LocalRank, p.sources)
	}
	if err := p.Local.checkBases(localBases); err != nil {
		return nil, fmt.Errorf("local: %w", err)
	}
	if p.whole {
		return appendWholeBlocks(make([]Desc, 0, p.Local.NumRegions()*p.Local.NumBlocks), p.Local, localBases, devID), nil
	}
	out := make([]Desc, 0, p.Local.NumDescs()*p.ratio)
	dlen := uint64(p.Local.DescLen()) / uint64(p.ratio)
	return appendBlockDescs(out, p.Local, localBases, p.ratio, 0, dlen, len(p.sources), slot, devID), nil
}

// Indices computes the paired descriptor indices of one READ, as vLLM's _read_blocks: local ids are
// expanded to sub-blocks (b·ratio .. b·ratio+ratio-1) and clipped to the remote count; when fewer local
// than remote blocks remain (prefix-cache hit) the remote list keeps its last entries; then, region-major,
// local index = r·(Local.NumBlocks·ratio) + id, remote index = r·Remote.NumBlocks + id. Element i of the
// two results is one transfer pair. Remote ids are checked against the remote geometry, local ids against
// the local one, before anything is computed. Results are appended to localDst[:0] and remoteDst[:0].
func (p *ReadPlan) Indices(localIDs, remoteIDs []int, localDst, remoteDst []int) (local, remote []int, err error) {
	local, remote = localDst[:0], remoteDst[:0]
	if err := p.Local.CheckBlockIDs(localIDs, 0); err != nil {
		return local, remote, fmt.Errorf("local: %w", err)
	}
	if err := p.Remote.CheckBlockIDs(remoteIDs, 0); err != nil {
		return local, remote, fmt.Errorf("remote: %w", err)
	}
	local, remote = p.AppendIndices(local, remote, localIDs, remoteIDs)
	return local, remote, nil
}

// AppendIndices is Indices for block ids already checked (Local.CheckBlockIDs, Remote.CheckBlockIDs): it
// appends the descriptor indices to localDst and remoteDst and checks nothing, so a caller that checked a
// request's ids once can index any slice of them.
func (p *ReadPlan) AppendIndices(localDst, remoteDst []int, localIDs, remoteIDs []int) (local, remote []int) {
	local, remote = localDst, remoteDst
	nLocal := min(len(localIDs)*p.ratio, len(remoteIDs))
	if nLocal < len(remoteIDs) {
		remoteIDs = remoteIDs[len(remoteIDs)-nLocal:]
	}
	regions := p.descRegions()
	lstride := p.Local.NumBlocks * p.ratio
	for r := range regions {
		for i := range nLocal {
			local = append(local, r*lstride+localIDs[i/p.ratio]*p.ratio+i%p.ratio)
		}
	}
	remote = appendIndices(remote, regions, p.Remote.NumBlocks, remoteIDs)
	return local, remote
}

// NotifsExpected is how many notifications each P rank waits for per request from this D engine:
// D_tp/P_tp when D_tp > P_tp, else 1.
func (p *ReadPlan) NotifsExpected() int { return max(1, p.LocalTP/p.RemoteTP) }
