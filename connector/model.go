package connector

import (
	"errors"
	"fmt"
	"strings"

	"go.uber.org/zap"

	"github.com/gonixl/gonixl/connector/protocol"
	"github.com/gonixl/gonixl/layout"
)

// Model describes the model whose KV cache moves, once, as vLLM's configuration knows it. With the vLLM
// release of the peers (a protocol.Profile) it yields the cache geometry of one TP rank (Geometry), the region
// plan of that release's layout era, and the compatibility-hash inputs with that release's defaults
// (CompatInputs, hashed with the profile's Version). Set it in PrefillConfig.Model / DecodeConfig.Model with
// VLLMVersion and the roles derive the rest.
type Model struct {
	// Name is vLLM's --model, exactly as the vLLM side was given it (it is hashed), e.g. "Qwen/Qwen3-0.6B".
	Name string
	// Layers is num_hidden_layers (the attention layers whose KV cache moves).
	Layers int
	// KVHeads is the number of KV heads of the whole model (num_key_value_heads); a TP rank holds
	// KVHeads/TP of them, or one when TP exceeds KVHeads (vLLM replicates them).
	KVHeads int
	// HeadDim is the head size (head_dim).
	HeadDim int
	// DType is the model's dtype (and the KV cache's, unless CacheDType is set).
	DType layout.DType
	// CacheDType is the KV cache's element type when it differs from DType (vLLM's --kv-cache-dtype); 0 = DType,
	// hashed as vLLM's "auto". FP8E4M3 and FP8E5M2 hash as "fp8_e4m3" and "fp8_e5m2": a vLLM side given plain
	// "fp8" hashes that string, so set Compat.CacheDtype = "fp8" then.
	CacheDType layout.DType
	// AttnBackend is the vLLM side's attention backend name; "" = the release's default on CUDA
	// (Profile.Defaults.AttnBackend). A vLLM side on the CPU platform hashes "CPU_ATTN"
	// (protocol.AttnBackendCPU), and its cache holds CPU_ATTN's own block format: with AttnBackend "CPU_ATTN"
	// the cache is layout.CPUAttn (see Order), the handshake publishes "CPU_ATTN" and HND's label, and the
	// compatibility hash matches a vLLM CPU engine's.
	AttnBackend string
	// BlockSize is vLLM's --block-size; 0 = 16, vLLM's default (vLLM's CPU platform wants a multiple of 32).
	BlockSize int
	// Order is the physical block order; 0 = HND, what vLLM's NixlConnector asks the attention backend for, or
	// layout.CPUAttn when AttnBackend is "CPU_ATTN" and the cache is fp32 or fp16. A bf16 CPU_ATTN cache must
	// state its packing, because vLLM picks it by the CPU: layout.CPUAttn when the vLLM CPU engine runs
	// without AMX tiles (its kernel ISA "vec"/"vec16"/"neon"), layout.CPUAttnAMX on Intel CPUs with AMX (which
	// gonixl refuses: not modelled). With AttnBackend "CPU_ATTN" any other order is refused: a vLLM CPU engine
	// reads CPU_ATTN blocks from a peer that publishes that name.
	Order layout.BlockOrder
}

// DefaultBlockSize is vLLM's default --block-size.
const DefaultBlockSize = 16

// Geometry returns the paged KV cache geometry of one of tpSize TP ranks (tpSize ≤ 1: one rank) with
// numBlocks blocks, in the region plan of p's layout era.
func (m Model) Geometry(p protocol.Profile, numBlocks, tpSize int) (layout.Geometry, error) {
	plan, err := planFor(p)
	if err != nil {
		return layout.Geometry{}, err
	}
	if tpSize < 1 {
		tpSize = 1
	}
	heads, err := layout.HeadsPerRank(m.KVHeads, tpSize)
	if err != nil {
		return layout.Geometry{}, fmt.Errorf("connector: Model %q: %w", m.Name, err)
	}
	g := layout.Geometry{NumLayers: m.Layers, NumBlocks: numBlocks, BlockSize: m.BlockSize, NumKVHeads: heads,
		HeadDim: m.HeadDim, DType: m.DType, Order: m.Order, Plan: plan}
	if g.BlockSize == 0 {
		g.BlockSize = DefaultBlockSize
	}
	if m.CacheDType != 0 {
		g.DType = m.CacheDType
	}
	if err := m.defaultOrder(&g); err != nil {
		return layout.Geometry{}, err
	}
	return g, g.Validate()
}

// defaultOrder sets g.Order when the model leaves it to the attention backend, and refuses a CPU_ATTN model
// whose order is not a CPU_ATTN format.
func (m Model) defaultOrder(g *layout.Geometry) error {
	cpu := m.AttnBackend == protocol.AttnBackendCPU
	switch {
	case g.Order == 0 && !cpu:
		g.Order = layout.HND
	case g.Order == 0 && g.DType == layout.BF16:
		return fmt.Errorf("%w: Model %q: a bf16 CPU_ATTN cache is packed by the vLLM CPU engine's kernel ISA: set Model.Order "+
			"to layout.CPUAttn for a vLLM CPU engine without AMX tiles (AVX2/AVX512 without AMX, ARM), layout.CPUAttnAMX "+
			"(refused: not modelled) on CPUs with AMX", layout.ErrInvalidGeometry, m.Name)
	case g.Order == 0:
		g.Order = layout.CPUAttn
	case cpu && !g.Order.IsCPUAttn():
		return fmt.Errorf("%w: Model %q: AttnBackend %q with Order %v: a vLLM CPU decode engine reads CPU_ATTN blocks from a "+
			"peer that publishes %q; leave Order unset (layout.CPUAttn), or stage %v for a backend whose layout it is "+
			"(AttnBackend \"FLASH_ATTN\") and have the vLLM decode set enforce_handshake_compat=false, so that it repacks",
			layout.ErrInvalidGeometry, m.Name, m.AttnBackend, g.Order, protocol.AttnBackendCPU, g.Order)
	case !cpu && g.Order.IsCPUAttn():
		return fmt.Errorf("%w: Model %q: Order %v needs AttnBackend %q (the hash and the handshake name the backend whose "+
			"layout the cache holds)", layout.ErrInvalidGeometry, m.Name, g.Order, protocol.AttnBackendCPU)
	}
	return nil
}

// torchNames are str(torch dtype) of the model dtypes, as vLLM hashes them.
var torchNames = map[layout.DType]string{layout.BF16: "torch.bfloat16", layout.FP16: "torch.float16", layout.FP32: "torch.float32"}

// cacheDtypeNames are vLLM's --kv-cache-dtype spellings of the cache element types.
var cacheDtypeNames = map[layout.DType]string{layout.FP8E4M3: "fp8_e4m3", layout.FP8E5M2: "fp8_e5m2"}

// CompatInputs returns the compatibility-hash inputs of the model under p's release: the vLLM side's version
// string is p.Version (protocol.ProfileFor sets it), and that release's defaults fill in everything the model
// does not say (Profile.DefaultCompatInputs). Change a field of the result only where the vLLM side changed its
// defaults, and pass it as Compat.
func (m Model) CompatInputs(p protocol.Profile) (protocol.CompatInputs, error) {
	if p.Version == "" {
		return protocol.CompatInputs{}, fmt.Errorf("connector: Model %q: profile %s has no Version (it is hashed): use protocol.ProfileFor(the peers' version string), or set Profile.Version",
			m.Name, p.Name)
	}
	in := p.DefaultCompatInputs("")
	in.Model = m.Name
	in.NumKVHeads, in.HeadSize, in.NumHiddenLayers = int64(m.KVHeads), int64(m.HeadDim), int64(m.Layers)
	var ok bool
	if in.Dtype, ok = torchNames[m.DType]; !ok {
		return protocol.CompatInputs{}, fmt.Errorf("%w: Model %q: DType %v is not a model dtype (want BF16, FP16 or FP32; an fp8 KV cache is CacheDType)",
			layout.ErrInvalidGeometry, m.Name, m.DType)
	}
	if m.CacheDType != 0 && m.CacheDType != m.DType {
		if in.CacheDtype, ok = cacheDtypeNames[m.CacheDType]; !ok {
			in.CacheDtype = m.CacheDType.String()
		}
	}
	if m.AttnBackend != "" {
		in.AttnBackendName = m.AttnBackend
	}
	return in, nil
}

// modelSpec is what PrefillConfig and DecodeConfig share to derive their profile, compatibility inputs and
// cache from a Model.
type modelSpec struct {
	version   string
	model     Model
	numBlocks int
	tpSize    int
}

// resolve fills profile (and its Version) from the version, compat from the model (unless compat was given)
// and, when cache is nil and numBlocks > 0, creates a DRAM cache for the model, which it returns for the role
// to own.
func (s modelSpec) resolve(profile *protocol.Profile, compat *Compat, cache *Cache) (*DRAMCache, error) {
	if s.version != "" {
		p, err := protocol.ProfileFor(s.version)
		if err != nil {
			return nil, fmt.Errorf("connector: VLLMVersion: %w", err)
		}
		switch {
		case profile.Name == "":
			*profile = p
		case profile.Name != p.Name:
			return nil, fmt.Errorf("connector: VLLMVersion %q is in profile %s but Profile is %s; set one of them", s.version, p.Name, profile.Name)
		case profile.Version == "":
			profile.Version = s.version
		case profile.Version != s.version:
			return nil, fmt.Errorf("connector: VLLMVersion is %q but Profile.Version is %q; set one of them", s.version, profile.Version)
		}
	}
	if s.model == (Model{}) {
		return nil, nil
	}
	if profile.Name == "" {
		return nil, errors.New("connector: a Model needs VLLMVersion (the vLLM version string of the peers, e.g. \"0.16.0\")")
	}
	if compat.VLLMVersion == "" && compat.Model == "" {
		if profile.Version == "" {
			return nil, errors.New("connector: a Model without Compat needs VLLMVersion or Profile.Version (the version string is hashed)")
		}
		in, err := s.model.CompatInputs(*profile)
		if err != nil {
			return nil, err
		}
		compat.CompatInputs = in
	}
	if *cache != nil || s.numBlocks <= 0 {
		return nil, nil
	}
	g, err := s.model.Geometry(*profile, s.numBlocks, s.tpSize)
	if err != nil {
		return nil, err
	}
	c, err := NewDRAMCache(g, false)
	if err != nil {
		return nil, err
	}
	*cache = c
	return c, nil
}

// roleSpec is what PrefillConfig and DecodeConfig share to set their role up.
type roleSpec struct {
	role    string // "prefill" or "decode"
	profile protocol.Profile
	cache   Cache
	tpRank  int
	logger  *zap.Logger
	metrics *Metrics
}

// setup checks that the profile is set and that the cache's region plan is the profile's layout era, defaults
// the engine id (a random "gonixl-p-…" or "gonixl-d-…") and the TP size (1), and returns the role's logger
// (tagged with the role, engine id and TP rank) and metrics (a private Metrics when none was given).
func (s roleSpec) setup(engineID *string, tpSize *int) (*zap.Logger, *Metrics, error) {
	if s.profile.Name == "" {
		return nil, nil, fmt.Errorf("connector: %s%sConfig.Profile is not set (use protocol.ProfileFor)",
			strings.ToUpper(s.role[:1]), s.role[1:])
	}
	if *engineID == "" {
		*engineID = randomID("gonixl-" + s.role[:1] + "-")
	}
	if *tpSize <= 0 {
		*tpSize = 1
	}
	log := s.logger
	if log == nil {
		log = zap.NewNop()
	}
	log = log.With(zap.String("role", s.role), zap.String("engine_id", *engineID), zap.Int("tp_rank", s.tpRank))
	metrics := s.metrics
	if metrics == nil {
		metrics = &Metrics{}
	}
	return log, metrics, checkPlan(s.profile, s.cache)
}

// NewPrefill starts a prefill worker: it derives Profile, Compat and (when Cache is nil) a DRAM cache from
// VLLMVersion and Model, registers the cache, and starts the side channel and the notification loop.
func NewPrefill(cfg PrefillConfig) (*Prefill, error) {
	if cfg.HoldTimeout < 0 {
		return nil, fmt.Errorf("connector: PrefillConfig.HoldTimeout is %v: set a positive duration, or 0 for the profile's lease or abort timeout", cfg.HoldTimeout)
	}
	if n := len(cfg.NotifyKey); n > 0 && n < minNotifyKey {
		return nil, fmt.Errorf("connector: PrefillConfig.NotifyKey has %d bytes: give at least %d random bytes (the same on every rank of the engine)", n, minNotifyKey)
	}
	if cfg.TPSize > 1 && cfg.SideChannel == nil && len(cfg.NotifyKey) == 0 {
		// Ranks in separate processes would each draw a random key, and every rank but the one whose
		// remote_request_id the decode echoes would drop its notifications as forged (blocks held to expiry).
		return nil, fmt.Errorf("connector: PrefillConfig.TPSize is %d with no shared SideChannel: set NotifyKey to the same secret (at least %d random bytes) on every rank, or share one sidechannel.Server between the ranks of one process", cfg.TPSize, minNotifyKey)
	}
	return startWithModel(modelSpec{cfg.VLLMVersion, cfg.Model, cfg.NumBlocks, cfg.TPSize}, &cfg.Profile, &cfg.Compat, &cfg.Cache,
		func() (*Prefill, error) { return newPrefill(cfg) })
}

// NewDecode starts a decode worker: it derives Profile, Compat and (when Cache is nil) a DRAM cache from
// VLLMVersion and Model, registers the cache and prepares its descriptor list.
func NewDecode(cfg DecodeConfig) (*Decode, error) {
	if cfg.HandshakeTimeout < 0 {
		return nil, fmt.Errorf("connector: DecodeConfig.HandshakeTimeout is %v: set a positive duration, or 0 for the profile's", cfg.HandshakeTimeout)
	}
	return startWithModel(modelSpec{cfg.VLLMVersion, cfg.Model, cfg.NumBlocks, cfg.TPSize}, &cfg.Profile, &cfg.Compat, &cfg.Cache,
		func() (*Decode, error) { return newDecode(cfg) })
}

// startWithModel resolves s into the config's fields, then starts the role; the cache it created belongs to the
// role's registration (closed after the agent), or is closed at once when the role does not start.
func startWithModel[R interface{ registration() *registered }](s modelSpec, profile *protocol.Profile, compat *Compat,
	cache *Cache, start func() (R, error)) (R, error) {
	var zero R
	owned, err := s.resolve(profile, compat, cache)
	if err != nil {
		return zero, err
	}
	r, err := start()
	if err != nil {
		if owned != nil {
			_ = owned.Close()
		}
		return zero, err
	}
	r.registration().owned = owned
	return r, nil
}

func (p *Prefill) registration() *registered { return p.reg }
func (d *Decode) registration() *registered  { return d.reg }

// Cache returns the KV cache the role serves (the one it created from the Model when PrefillConfig.Cache was nil).
func (p *Prefill) Cache() Cache { return p.cfg.Cache }

// Profile returns the vLLM release the role speaks.
func (p *Prefill) Profile() protocol.Profile { return p.cfg.Profile }

// Cache returns the KV cache the READs land in (the one it created from the Model when DecodeConfig.Cache was nil).
func (d *Decode) Cache() Cache { return d.cfg.Cache }

// Profile returns the vLLM release the role speaks.
func (d *Decode) Profile() protocol.Profile { return d.cfg.Profile }
