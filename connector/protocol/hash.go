package protocol

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math"
	"math/big"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"
)

// CompatInputs are the values vLLM feeds into compute_nixl_compatibility_hash. A Go peer must use the vLLM
// side's exact strings: its version string (GET /version), its --model string as typed, str(torch dtype), ...
//
// Start from Profile.DefaultCompatInputs, which fills in the profile's Version and what vLLM uses when its user
// sets nothing (HMA, attention backend of the platform, cache dtype, transfer mode), and set the model's values;
// a struct literal leaves HMAEnabled false, which is not vLLM's default from 0.22.
type CompatInputs struct {
	// VLLMVersion is vllm.__version__ of the side whose hash we reproduce, e.g. "0.16.0"; "" = Profile.Version.
	VLLMVersion     string
	Model           string // model_config.model, exactly as given on the command line
	Dtype           string // str(model_config.dtype), e.g. "torch.bfloat16"
	NumKVHeads      int64  // total KV heads (not per rank)
	HeadSize        int64
	NumHiddenLayers int64
	// Platform is the vLLM platform of the side whose hash we reproduce ("" = PlatformCUDA). It only picks the
	// default AttnBackendName: vLLM hashes its own backend's name, so follow the peer (a vLLM prefill on CPU
	// hashes "CPU_ATTN", on a CUDA GPU "FLASH_ATTN").
	Platform Platform
	// AttnBackendName is the vLLM side's attention backend, e.g. "FLASH_ATTN"; "" = the row's default for
	// Platform (Profile.Defaults.AttnBackend).
	AttnBackendName string
	CacheDtype      string // str(cache_config.cache_dtype); "" = "auto" (vLLM's default)
	// CrossLayersBlocks (0.16–0.28): true only with enable_cross_layers_blocks and a suitable backend.
	CrossLayersBlocks bool
	// HMAEnabled (0.18+): not scheduler_config.disable_hybrid_kv_cache_manager. vLLM's default is
	// Profile.Defaults.HMAEnabled (false in 0.18–0.21, true from 0.22 for an ordinary model).
	HMAEnabled bool
	// SpeculativeConfig (0.28+): nil (JSON null) unless the vLLM side runs EAGLE/MTP; then the dict vLLM builds
	// (method, model, revision, code_revision, parallel_drafting, kv_cache_dtype, auxiliary_layer_ids). Values
	// may be nil, bool, ints, float64, string, []any or map[string]any.
	SpeculativeConfig map[string]any
	// TransferMode (0.28+): "pull" (the default when empty) or "push".
	TransferMode string
}

// Platform is a vLLM platform (current_platform), as far as the compatibility hash is concerned.
type Platform string

// Platforms whose default attention backend the profiles know.
const (
	PlatformCUDA Platform = "cuda"
	PlatformCPU  Platform = "cpu"
)

// CompatDefaults are the hash inputs a vLLM release uses for an ordinary (non-MLA, non-hybrid, no speculative
// decoding) model when its user sets none of them, with NixlConnector configured.
type CompatDefaults struct {
	// HMAEnabled: not disable_hybrid_kv_cache_manager after VllmConfig.__post_init__ (vllm/config/vllm.py):
	// 0.18–0.21 turn HMA off whenever --kv-transfer-config is set; from 0.22 only for connectors that are not
	// SupportsHMA, and NixlConnector is.
	HMAEnabled bool
	// AttnBackend is the backend vLLM selects per platform (AttentionBackend.get_name()): FLASH_ATTN on CUDA
	// (Hopper and older; Blackwell may select FLASHINFER), CPU_ATTN on the CPU platform.
	AttnBackend map[Platform]string
	// CacheDtype is cache_config.cache_dtype's default ("auto").
	CacheDtype string
	// TransferMode is the pull connector's mode ("pull"; hashed from 0.28).
	TransferMode string
}

var (
	defaultBackends = map[Platform]string{PlatformCUDA: "FLASH_ATTN", PlatformCPU: "CPU_ATTN"}
	// defaultsV016: 0.16–0.21 (0.16–0.17 do not hash HMA; 0.18–0.21 hash it off).
	defaultsV016 = CompatDefaults{HMAEnabled: false, AttnBackend: defaultBackends, CacheDtype: "auto", TransferMode: "pull"}
	// defaultsV022: 0.22+.
	defaultsV022 = CompatDefaults{HMAEnabled: true, AttnBackend: defaultBackends, CacheDtype: "auto", TransferMode: "pull"}
)

// DefaultCompatInputs returns the hash inputs of this row's vLLM defaults on platform ("" = CUDA) for the
// profile's Version (the string ProfileFor was given; empty from ProfileByName until set); set the model's values
// (Model, Dtype, NumKVHeads, HeadSize, NumHiddenLayers) and change only what the vLLM side changed from its
// defaults.
func (p Profile) DefaultCompatInputs(platform Platform) CompatInputs {
	if platform == "" {
		platform = PlatformCUDA
	}
	return CompatInputs{
		VLLMVersion:     p.Version,
		Platform:        platform,
		AttnBackendName: p.Defaults.AttnBackend[platform],
		CacheDtype:      p.Defaults.CacheDtype,
		HMAEnabled:      p.Defaults.HMAEnabled,
		TransferMode:    p.Defaults.TransferMode,
	}
}

// withDefaults fills the string inputs left empty with the profile's Version and the row's defaults.
func (p Profile) withDefaults(in CompatInputs) CompatInputs {
	if in.VLLMVersion == "" {
		in.VLLMVersion = p.Version
	}
	if in.AttnBackendName == "" {
		pl := in.Platform
		if pl == "" {
			pl = PlatformCUDA
		}
		in.AttnBackendName = p.Defaults.AttnBackend[pl]
	}
	if in.CacheDtype == "" {
		in.CacheDtype = p.Defaults.CacheDtype
	}
	if in.TransferMode == "" {
		in.TransferMode = p.Defaults.TransferMode
	}
	return in
}

// hashFactor computes one factor value; factors are data, selected per profile by Profile.HashFactors.
var hashFactor = map[string]func(p Profile, in CompatInputs) any{
	"vllm_version":           func(_ Profile, in CompatInputs) any { return in.VLLMVersion },
	"nixl_connector_version": func(p Profile, _ CompatInputs) any { return int64(p.ConnectorVersion) },
	"model":                  func(_ Profile, in CompatInputs) any { return in.Model },
	"dtype":                  func(_ Profile, in CompatInputs) any { return in.Dtype },
	"num_kv_heads":           func(_ Profile, in CompatInputs) any { return in.NumKVHeads },
	"head_size":              func(_ Profile, in CompatInputs) any { return in.HeadSize },
	"num_hidden_layers":      func(_ Profile, in CompatInputs) any { return in.NumHiddenLayers },
	"attn_backend_name":      func(_ Profile, in CompatInputs) any { return in.AttnBackendName },
	"cache_dtype":            func(_ Profile, in CompatInputs) any { return in.CacheDtype },
	"cross_layers_blocks":    func(_ Profile, in CompatInputs) any { return in.CrossLayersBlocks },
	"is_hma_enabled":         func(_ Profile, in CompatInputs) any { return in.HMAEnabled },
	"speculative_config": func(_ Profile, in CompatInputs) any {
		if in.SpeculativeConfig == nil {
			return nil
		}
		return in.SpeculativeConfig
	},
	"transfer_mode": func(_ Profile, in CompatInputs) any { return in.TransferMode },
}

// Factors returns the factor dict of this profile's compute_nixl_compatibility_hash for the inputs, with an
// empty VLLMVersion taken from the profile's Version and empty AttnBackendName, CacheDtype and TransferMode from
// the row's defaults. It fails with ErrInvalid when a string input vLLM always has is still empty (a hash over
// "" would silently never match).
func (p Profile) Factors(in CompatInputs) (map[string]any, error) {
	in = p.withDefaults(in)
	if in.VLLMVersion == "" {
		return nil, fmt.Errorf("%w: CompatInputs.VLLMVersion and Profile.Version are empty: get the profile with ProfileFor(the vLLM side's version string), or set Profile.Version to that string (ProfileByName leaves it empty)",
			ErrInvalid)
	}
	for name, v := range map[string]string{"Model": in.Model, "Dtype": in.Dtype,
		"AttnBackendName": in.AttnBackendName, "CacheDtype": in.CacheDtype} {
		if v == "" {
			return nil, fmt.Errorf("%w: CompatInputs.%s is empty and vLLM %s has no default for it (platform %q); use the vLLM side's exact value",
				ErrInvalid, name, p.Name, in.Platform)
		}
	}
	out := make(map[string]any, len(p.HashFactors))
	for _, k := range p.HashFactors {
		f, ok := hashFactor[k]
		if !ok {
			return nil, fmt.Errorf("%w: profile %s names unknown hash factor %q", ErrInvalid, p.Name, k)
		}
		out[k] = f(p, in)
	}
	return out, nil
}

// CompatHash returns this profile's compatibility hash for the inputs (what the vLLM side would compute).
func (p Profile) CompatHash(in CompatInputs) (string, error) {
	f, err := p.Factors(in)
	if err != nil {
		return "", err
	}
	return factorDigest(f)
}

// FactorsJSON returns the factor dict as vLLM hashes it (json.dumps(factors, sort_keys=True)): what to compare
// with the vLLM side's when the hashes differ.
func (p Profile) FactorsJSON(in CompatInputs) (string, error) {
	f, err := p.Factors(in)
	if err != nil {
		return "", err
	}
	return pyJSONDumps(f)
}

// factorDigest returns hashlib.sha256(json.dumps(factors, sort_keys=True).encode()).hexdigest(): the hash of
// a factor dict (Profile.Factors).
func factorDigest(factors map[string]any) (string, error) {
	js, err := pyJSONDumps(factors)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256([]byte(js))
	return hex.EncodeToString(sum[:]), nil
}

// pyJSONDumps reproduces Python's json.dumps(v, sort_keys=True) with its defaults: separators ", " and ": ",
// ensure_ascii (\uXXXX escapes, lowercase hex, surrogate pairs), float repr ("1e-05", "1e+16", "1.0"),
// NaN/Infinity, true/false/null. Accepted types: nil, bool, all Go integer types, *big.Int, float32/64,
// string, []any, []string, []int64, []int, map[string]any.
func pyJSONDumps(v any) (string, error) {
	var b strings.Builder
	if err := pyDump(&b, v, 0); err != nil {
		return "", err
	}
	return b.String(), nil
}

func pyDump(b *strings.Builder, v any, depth int) error {
	if depth > 100 {
		return fmt.Errorf("%w: value nested deeper than 100 levels", ErrInvalid)
	}
	switch x := v.(type) {
	case nil:
		b.WriteString("null")
	case bool:
		if x {
			b.WriteString("true")
		} else {
			b.WriteString("false")
		}
	case int, int8, int16, int32, int64, uint, uint8, uint16, uint32, uint64:
		fmt.Fprint(b, x) // decimal, as Python's int
	case *big.Int:
		if x == nil {
			b.WriteString("null")
		} else {
			b.WriteString(x.String())
		}
	case float32:
		b.WriteString(pyFloatRepr(float64(x)))
	case float64:
		b.WriteString(pyFloatRepr(x))
	case string:
		if err := pyString(b, x); err != nil {
			return err
		}
	case []string:
		return pySeq(b, '[', ']', len(x), func(i int) error { return pyString(b, x[i]) })
	case []int64:
		return pySeq(b, '[', ']', len(x), func(i int) error { _, err := fmt.Fprint(b, x[i]); return err })
	case []int:
		return pySeq(b, '[', ']', len(x), func(i int) error { _, err := fmt.Fprint(b, x[i]); return err })
	case []any:
		return pySeq(b, '[', ']', len(x), func(i int) error { return pyDump(b, x[i], depth+1) })
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys) // byte order of UTF-8 = code point order = Python's str ordering
		return pySeq(b, '{', '}', len(keys), func(i int) error {
			if err := pyString(b, keys[i]); err != nil {
				return err
			}
			b.WriteString(": ")
			return pyDump(b, x[keys[i]], depth+1)
		})
	default:
		return fmt.Errorf("%w: json.dumps of Go type %T is not supported", ErrInvalid, v)
	}
	return nil
}

// pySeq writes n items between left and right, separated as json.dumps separates them (", ").
func pySeq(b *strings.Builder, left, right byte, n int, item func(i int) error) error {
	b.WriteByte(left)
	for i := range n {
		if i > 0 {
			b.WriteString(", ")
		}
		if err := item(i); err != nil {
			return err
		}
	}
	b.WriteByte(right)
	return nil
}

const hexDigits = "0123456789abcdef"

func pyString(b *strings.Builder, s string) error {
	if !utf8.ValidString(s) {
		return fmt.Errorf("%w: string %q is not valid UTF-8", ErrInvalid, s)
	}
	b.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"':
			b.WriteString(`\"`)
		case r == '\\':
			b.WriteString(`\\`)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r == '\b':
			b.WriteString(`\b`)
		case r == '\f':
			b.WriteString(`\f`)
		case r >= 0x20 && r <= 0x7e:
			b.WriteRune(r)
		case r > 0xffff:
			r -= 0x10000
			writeU(b, 0xd800|(r>>10)&0x3ff)
			writeU(b, 0xdc00|r&0x3ff)
		default:
			writeU(b, r)
		}
	}
	b.WriteByte('"')
	return nil
}

func writeU(b *strings.Builder, r rune) {
	b.WriteString(`\u`)
	for shift := 12; shift >= 0; shift -= 4 {
		b.WriteByte(hexDigits[(r>>uint(shift))&0xf])
	}
}

// pyFloatRepr returns Python's repr(float): the shortest round-trip digits, in positional notation when the
// decimal exponent is in [-4, 16), else in scientific notation with a signed, at-least-two-digit exponent.
func pyFloatRepr(f float64) string {
	switch {
	case math.IsNaN(f):
		return "NaN"
	case math.IsInf(f, 1):
		return "Infinity"
	case math.IsInf(f, -1):
		return "-Infinity"
	}
	s := strconv.FormatFloat(f, 'e', -1, 64) // [-]d[.ddd]e±XX
	sign := ""
	if s[0] == '-' {
		sign, s = "-", s[1:]
	}
	e := strings.IndexByte(s, 'e')
	mant, expStr := s[:e], s[e+1:]
	exp, _ := strconv.Atoi(expStr)
	digits := strings.Replace(mant, ".", "", 1)
	decpt := exp + 1 // value = 0.<digits> × 10^decpt
	if decpt <= -4 || decpt > 16 {
		m := digits[:1]
		if len(digits) > 1 {
			m += "." + digits[1:]
		}
		es := "+"
		if exp < 0 {
			es, exp = "-", -exp
		}
		return fmt.Sprintf("%s%se%s%02d", sign, m, es, exp)
	}
	switch {
	case decpt <= 0:
		return sign + "0." + strings.Repeat("0", -decpt) + digits
	case decpt >= len(digits):
		return sign + digits + strings.Repeat("0", decpt-len(digits)) + ".0"
	default:
		return sign + digits[:decpt] + "." + digits[decpt:]
	}
}

// explainMismatch describes our side of a hash mismatch: the factor dict we hashed and, where one default-able
// input (HMA, attention backend, cache dtype, cross-layer blocks, transfer mode) set otherwise reproduces the
// remote hash, which.
func (p Profile) explainMismatch(in *CompatInputs, remote string) string {
	if in == nil {
		return ""
	}
	js, err := p.FactorsJSON(*in)
	if err != nil {
		return ""
	}
	out := "; our hash inputs: " + js
	base := p.withDefaults(*in)
	try := func(desc string, alt CompatInputs) bool {
		if h, err := p.CompatHash(alt); err == nil && h == remote {
			out += "; the remote hash equals ours with " + desc
			return true
		}
		return false
	}
	alt := base
	alt.HMAEnabled = !base.HMAEnabled
	if try(fmt.Sprintf("is_hma_enabled=%v", alt.HMAEnabled), alt) {
		return out
	}
	alt = base
	alt.CrossLayersBlocks = !base.CrossLayersBlocks
	if try(fmt.Sprintf("cross_layers_blocks=%v", alt.CrossLayersBlocks), alt) {
		return out
	}
	for _, name := range []string{"FLASH_ATTN", "CPU_ATTN", "FLASHINFER", "TRITON_ATTN", "FLEX_ATTENTION", "ROCM_ATTN", "ROCM_AITER_FA"} {
		alt = base
		alt.AttnBackendName = name
		if name != base.AttnBackendName && try(fmt.Sprintf("attn_backend_name=%q (CompatInputs.AttnBackendName / Platform)", name), alt) {
			return out
		}
	}
	alt = base
	alt.CacheDtype = "auto"
	if base.CacheDtype != "auto" && try(`cache_dtype="auto"`, alt) {
		return out
	}
	for _, mode := range []string{"pull", "push"} {
		alt = base
		alt.TransferMode = mode
		if mode != base.TransferMode && try(fmt.Sprintf("transfer_mode=%q", mode), alt) {
			return out
		}
	}
	return out
}
