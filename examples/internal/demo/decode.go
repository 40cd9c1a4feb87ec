package demo

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"time"

	"go.uber.org/zap"

	"github.com/gonixl/gonixl/connector"
	"github.com/gonixl/gonixl/cuda"
	"github.com/gonixl/gonixl/layout"
	"github.com/gonixl/gonixl/nixl"
)

// DecodeConfig configures the demo decode server.
type DecodeConfig struct {
	VLLMVersion string // the vLLM version the prefill peer runs
	Model       connector.Model
	NumBlocks   int
	Order       layout.BlockOrder // the physical block order the decode side expects (sets Model.Order)
	Backends    []nixl.BackendSpec
	Library     *nixl.Library
	Logger      *zap.Logger
	// Cache is the local KV cache; nil = a DRAM cache. A cache that is not a *connector.DRAMCache must also
	// implement Reader so that the demo can verify what arrived.
	Cache connector.Cache
	// PullTimeout bounds one request's handshake and READ.
	PullTimeout time.Duration
	// DataDevice is connector.DecodeConfig.DataDevice ("" = every device).
	DataDevice string
	// ReadAgents is connector.DecodeConfig.ReadAgents (0 = the role's default; 1 = none).
	ReadAgents int
	// ReadSpin is connector.DecodeConfig.ReadSpin (0 = the role's default; negative = none).
	ReadSpin time.Duration
}

// model is the configured model in the configured block order (Order, when set, wins over Model.Order).
func (c DecodeConfig) model() connector.Model {
	m := c.Model
	if c.Order != 0 {
		m.Order = c.Order
	}
	return m
}

// DecodeServer is the demo decode worker: it READs the prefill worker's blocks into its own cache over NIXL
// and verifies every byte against what the prompt's KV must be.
type DecodeServer struct {
	api
	cfg   DecodeConfig
	cache connector.Cache
	own   *connector.DRAMCache
	pool  *connector.BlockPool
	role  *connector.Decode
}

// NewDecodeServer makes the cache and the decode role.
func NewDecodeServer(cfg DecodeConfig) (*DecodeServer, error) {
	if cfg.PullTimeout == 0 {
		cfg.PullTimeout = 60 * time.Second
	}
	cfg.Model = cfg.model()
	s := &DecodeServer{cfg: cfg, cache: cfg.Cache}
	if err := s.init(cfg.VLLMVersion, cfg.Logger, false, decodeID); err != nil {
		return nil, err
	}
	var err error
	if s.cache == nil {
		g, err := cfg.Model.Geometry(s.profile, cfg.NumBlocks, 1)
		if err != nil {
			return nil, err
		}
		if s.own, err = connector.NewDRAMCache(g, false); err != nil {
			return nil, err
		}
		s.cache = s.own
	}
	s.pool = connector.NewBlockPool(s.cache.Geometry().NumBlocks)
	if s.role, err = connector.NewDecode(connector.DecodeConfig{
		RoleConfig: connector.RoleConfig{VLLMVersion: cfg.VLLMVersion, Model: cfg.Model, Library: cfg.Library, Cache: s.cache, Backends: cfg.Backends, Logger: s.log, DataDevice: cfg.DataDevice},
		ReadAgents: cfg.ReadAgents, ReadSpin: cfg.ReadSpin,
	}); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// Role returns the decode role.
func (s *DecodeServer) Role() *connector.Decode { return s.role }

// Close releases the role and the cache.
func (s *DecodeServer) Close() {
	if s.role != nil {
		s.role.Close()
		s.role = nil
	}
	if s.own != nil {
		s.own.Close()
		s.own = nil
	}
}

// Handler returns the OpenAI-shaped HTTP API: POST /v1/completions, GET /version (VersionInfo), /health,
// /metrics.
func (s *DecodeServer) Handler() http.Handler {
	return s.handler(VersionInfo{Version: s.version, BlockSize: s.cache.Geometry().BlockSize}, s.role.Metrics(), s.completions)
}

func (s *DecodeServer) completions(w http.ResponseWriter, r *http.Request) {
	req, kv, id, ok := s.accept(w, r)
	if !ok {
		return
	}
	tokens := req.NumTokens()
	g := s.cache.Geometry()
	remote := kv.RemoteBlockIDs.Flat()
	if len(remote) != g.NeededBlocks(tokens) {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("kv_transfer_params name %d blocks for a %d-token prompt (want %d)", len(remote), tokens, g.NeededBlocks(tokens)))
		return
	}
	local, err := s.pool.Alloc(len(remote))
	if err != nil { // connector.ErrNoBlocks: 503 with Retry-After
		writeError(w, http.StatusServiceUnavailable, err.Error())
		return
	}
	defer s.pool.Free(local)
	ctx, cancel := contextWithTimeout(r, s.cfg.PullTimeout)
	defer cancel()
	res, err := s.role.Pull(ctx, id, kv, local)
	pulled := time.Now()
	if err != nil {
		writeError(w, pullStatus(err), err.Error())
		return
	}
	verified, err := s.verify(KVChain(req.TokenIDs()), local)
	verifyTook := time.Since(pulled)
	if err != nil {
		s.log.Error("KV verification failed", zap.String("request_id", id), zap.Error(err))
		writeError(w, http.StatusInternalServerError, "KV verification failed: "+err.Error())
		return
	}
	resp := oneToken(id, req, fmt.Sprintf(" [decoded with %d prefilled tokens]", tokens), tokens)
	resp.Gonixl = &Timing{HandshakeMS: ms(res.Handshake), TransferMS: ms(res.Transfer), PostMS: ms(res.Post), WaitMS: ms(res.Wait), CopyMS: ms(res.Copy),
		VerifyMS: ms(verifyTook), TransferEndUS: pulled.Add(-res.Copy).UnixMicro(),
		TransferStartUS: pulled.Add(-res.Copy - res.Transfer).UnixMicro(),
		Bytes:           res.Bytes, Blocks: res.Blocks, VerifiedBytes: verified, Verified: true}
	writeJSON(w, http.StatusOK, resp)
}

// pullStatus maps a pull error to its HTTP status: 400 for kv_transfer_params that cannot be served, 503
// (with Retry-After) when the worker is stopping, 502 for a failure of the prefill peer or the transfer.
func pullStatus(err error) int {
	switch {
	case errors.Is(err, connector.ErrBadParams):
		return http.StatusBadRequest
	case errors.Is(err, nixl.ErrClosed):
		return http.StatusServiceUnavailable
	}
	return http.StatusBadGateway
}

// verify checks every byte the READ brought: for each layer it rebuilds what the prompt's K and V must be
// (from its KVChain: blocks the prefill reused from a cached prefix are checked like the others),
// converts them to paged blocks (zero padding included) and compares those blocks with the cache's. It also
// converts the cache's blocks back to (1, H, tokens, D) and compares the tokens, so a converter bug on either
// side cannot hide. Only the request's blocks are read back (s.blocks), so that verifying one request, run
// while others are in flight, moves that request's bytes and not the whole cache's. It returns the number of
// block bytes checked.
func (s *DecodeServer) verify(chain []uint64, blocks []int) (int64, error) {
	g := s.cache.Geometry()
	// The request's blocks side by side, block i of blocks at block id i+1 (0 is vLLM's null block): a geometry
	// of len(blocks)+1 blocks.
	compact := g
	compact.NumBlocks = len(blocks) + 1
	ids := make([]int, len(blocks))
	for i := range ids {
		ids[i] = i + 1
	}
	tokens := len(chain)
	src := layout.Source{Batch: 1, Heads: g.NumKVHeads, SeqLen: tokens, HeadDim: g.HeadDim}
	rowBytes := g.HeadDim * g.DType.Size()
	want := make([]byte, g.NumKVHeads*tokens*rowBytes)
	got := make([]byte, len(want))
	scratch := map[int][]byte{}
	regions := map[int][]byte{}
	q := layout.Seq{Row: 0, Tokens: tokens, BlockIDs: ids}
	var checked int64
	for l := 0; l < g.NumLayers; l++ {
		clear(regions)
		for _, kv := range []layout.KV{layout.K, layout.V} {
			r, err := g.Region(l, kv)
			if err != nil {
				return checked, err
			}
			if regions[r] == nil {
				if regions[r], err = s.blocks(r, blocks); err != nil {
					return checked, err
				}
			}
			for h := 0; h < g.NumKVHeads; h++ {
				FillHead(want[h*tokens*rowBytes:(h+1)*tokens*rowBytes], rowBytes, chain, l, kv, h)
			}
			if err := compact.FromPaged(got, src, kv, regions[r], q); err != nil {
				return checked, err
			}
			if !bytes.Equal(got, want) {
				return checked, fmt.Errorf("layer %d %v: token bytes differ from the prefill side's KV", l, kv)
			}
			sc := scratch[r%2]
			if sc == nil {
				sc = make([]byte, compact.RegionLen())
				scratch[r%2] = sc
			}
			if err := compact.ToPaged(sc, kv, want, src, q); err != nil {
				return checked, err
			}
		}
		for r, region := range regions {
			sc := scratch[r%2]
			bl := g.BlockLen()
			for i, b := range blocks {
				off := int64(i+1) * bl
				if !bytes.Equal(region[off:off+bl], sc[off:off+bl]) {
					return checked, fmt.Errorf("layer %d region %d block %d: bytes differ (zero padding included)", l, r, b)
				}
				checked += bl
			}
		}
	}
	return checked, nil
}

// blocks returns the given blocks of region r of the cache side by side in host memory, after one unused block
// (verify's compact geometry): copied from a DRAM cache, read back from a device cache one run of consecutive
// block ids at a time.
func (s *DecodeServer) blocks(r int, blocks []int) ([]byte, error) {
	g := s.cache.Geometry()
	bl := g.BlockLen()
	out := make([]byte, int64(len(blocks)+1)*bl)
	if s.own != nil {
		region := s.own.Region(r)
		for i, b := range blocks {
			copy(out[int64(i+1)*bl:], region[int64(b)*bl:int64(b+1)*bl])
		}
		return out, nil
	}
	var mem *cuda.DeviceMem
	switch c := s.cache.(type) {
	case *cuda.KVCache:
		mem = c.Mem()
	case *cuda.HostBufferedKVCache:
		mem = c.VRAM().Mem()
	default:
		return nil, fmt.Errorf("cache %T cannot be read back for verification", s.cache)
	}
	for i := 0; i < len(blocks); {
		j := i + 1
		for j < len(blocks) && blocks[j] == blocks[j-1]+1 {
			j++
		}
		off := g.RegionOffset(r) + int64(blocks[i])*bl
		if err := mem.Read(uint64(off), out[int64(i+1)*bl:int64(j+1)*bl]); err != nil {
			return nil, err
		}
		i = j
	}
	return out, nil
}
