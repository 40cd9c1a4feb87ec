package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/gonixl/gonixl/connector"
	"github.com/gonixl/gonixl/connector/protocol"
	"github.com/gonixl/gonixl/connector/sidechannel"
	"github.com/gonixl/gonixl/nixl"
)

const probeHelp = `Connects to a prefill worker's side channel (vLLM's VLLM_NIXL_SIDE_CHANNEL_HOST:PORT, default port 5600,
or a gonixl prefill role), requests each rank's handshake the way a vLLM decode worker does, and prints
what it advertises: compatibility hash, engine id, NIXL agent name (its metadata loaded into a throwaway
NIXL agent; without NIXL only the blob size is shown), block geometry and every region's base address and
length.

With --model (and the other hash inputs) the peer's compatibility hash is compared with the one this
configuration gives; a mismatch, or an engine id other than --engine-id, prints the report and exits 1.

Examples:
  gonixl probe tcp://10.0.0.5:5600 --vllm-version 0.16.0
  gonixl probe 10.0.0.5:5600 --vllm-version 0.33.0 --rank 0,0 --rank 0,1 --json
  gonixl probe tcp://p0:5600 --vllm-version 0.16.0 --model Qwen/Qwen3-0.6B --kv-heads 8 --head-size 128 --layers 28`

// rankList is the repeatable --rank flag: "pp,tp" or "tp".
type rankList []protocol.Rank

func (r *rankList) String() string {
	var s []string
	for _, x := range *r {
		s = append(s, fmt.Sprintf("%d,%d", x.PP, x.TP))
	}
	return strings.Join(s, " ")
}

func (r *rankList) Set(v string) error {
	parts := strings.Split(v, ",")
	if len(parts) > 2 {
		return fmt.Errorf("want pp,tp or tp, got %q", v)
	}
	var n []int
	for _, p := range parts {
		x, err := strconv.Atoi(strings.TrimSpace(p))
		if err != nil || x < 0 || x > protocol.MaxRank {
			return fmt.Errorf("want pp,tp or tp (non-negative integers), got %q", v)
		}
		n = append(n, x)
	}
	if len(n) == 1 {
		*r = append(*r, protocol.Rank{TP: n[0]})
	} else {
		*r = append(*r, protocol.Rank{PP: n[0], TP: n[1]})
	}
	return nil
}

// compatFlags are the compatibility-hash inputs of a local (decode) configuration.
type compatFlags struct {
	model, dtype, attn, cacheDtype, transferMode, platform string
	kvHeads, headSize, layers                              int64
	hma                                                    optBool
	crossLayers                                            bool
}

// optBool is a boolean flag that knows whether it was given (unset = the vLLM release's default).
type optBool struct{ set, v bool }

func (o *optBool) String() string {
	if o == nil || !o.set {
		return "vLLM's default"
	}
	return strconv.FormatBool(o.v)
}

func (o *optBool) Set(s string) error {
	v, err := strconv.ParseBool(s)
	if err != nil {
		return err
	}
	o.set, o.v = true, v
	return nil
}

func (o *optBool) IsBoolFlag() bool { return true }

func (c *compatFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&c.model, "model", "", "hash input: the model exactly as given to vLLM (--model); enables the hash check")
	fs.StringVar(&c.dtype, "dtype", "torch.bfloat16", "hash input: str(model dtype)")
	fs.Int64Var(&c.kvHeads, "kv-heads", 0, "hash input: total KV heads (not per rank)")
	fs.Int64Var(&c.headSize, "head-size", 0, "hash input: head size")
	fs.Int64Var(&c.layers, "layers", 0, "hash input: num_hidden_layers")
	fs.StringVar(&c.platform, "platform", "cuda", "the prefill side's vLLM platform (cuda or cpu): picks the default --attn-backend")
	fs.StringVar(&c.attn, "attn-backend", "", "hash input: attention backend name (default: the platform's, FLASH_ATTN on cuda, CPU_ATTN on cpu)")
	fs.StringVar(&c.cacheDtype, "cache-dtype", "auto", "hash input: KV cache dtype (--kv-cache-dtype)")
	fs.Var(&c.hma, "hma", "hash input (0.18+): is_hma_enabled (default: the release's, false in 0.18–0.21, true from 0.22); --hma=false when the prefill side disables the hybrid KV cache manager")
	fs.BoolVar(&c.crossLayers, "cross-layers", false, "hash input (0.16): cross_layers_blocks")
	fs.StringVar(&c.transferMode, "transfer-mode", "", "hash input (0.33): transfer_mode (default pull)")
}

// inputs are the hash inputs of the flags under p (whose Version profileFor set to --vllm-version).
func (c *compatFlags) inputs(p protocol.Profile) (protocol.CompatInputs, error) {
	if c.kvHeads <= 0 || c.headSize <= 0 || c.layers <= 0 {
		return protocol.CompatInputs{}, usagef("--model needs --kv-heads, --head-size and --layers (positive) to compute the hash")
	}
	in := p.DefaultCompatInputs(protocol.Platform(c.platform))
	in.Model, in.Dtype, in.NumKVHeads, in.HeadSize, in.NumHiddenLayers = c.model, c.dtype, c.kvHeads, c.headSize, c.layers
	if c.attn != "" {
		in.AttnBackendName = c.attn
	}
	if c.cacheDtype != "" {
		in.CacheDtype = c.cacheDtype
	}
	if c.transferMode != "" {
		in.TransferMode = c.transferMode
	}
	in.CrossLayersBlocks = c.crossLayers
	if c.hma.set {
		in.HMAEnabled = c.hma.v
	}
	return in, nil
}

type probeReport struct {
	Address     string            `json:"address"`
	VLLMVersion string            `json:"vllm_version"`
	Profile     string            `json:"profile"`
	LocalHash   string            `json:"local_compatibility_hash,omitempty"`
	LocalInputs string            `json:"local_hash_inputs,omitempty"` // the factor dict, as vLLM json.dumps it
	NIXL        string            `json:"nixl,omitempty"`              // why the agent names are missing
	Ranks       []probeRankReport `json:"ranks"`
}

type probeRankReport struct {
	PP                int      `json:"pp_rank"`
	TP                int      `json:"tp_rank"`
	RTTMillis         float64  `json:"rtt_ms"`
	ClockOffset       *float64 `json:"clock_offset_s,omitempty"`
	PayloadBytes      int      `json:"payload_bytes"`
	CompatibilityHash string   `json:"compatibility_hash"`
	HashMatch         *bool    `json:"hash_match,omitempty"`
	Metadata          metaView `json:"metadata"`
}

func runProbe(ctx context.Context, env *cmdEnv, args []string) error {
	fs := newFlagSet(env, probeHelp)
	var nf nixlFlags
	nf.register(fs)
	var cf compatFlags
	cf.register(fs)
	var ranks rankList
	version := fs.String("vllm-version", "", "the peer's vLLM version (selects the wire profile), e.g. 0.16.0, 0.33.0, or a profile name")
	fs.Var(&ranks, "rank", "prefill rank to ask for, pp,tp or tp (repeatable; default 0,0)")
	timeout := fs.Duration("timeout", 0, "per-attempt reply timeout (default: the profile's, 5s as in vLLM)")
	attempts := fs.Int("attempts", 2, "attempts per rank")
	engineID := fs.String("engine-id", "", "expected engine_id (kv_transfer_params.remote_engine_id); a different one exits 1")
	backends := fs.String("backends", "UCX", "NIXL backends of the throwaway agent that parses the peer's metadata (comma-separated; NIXL needs one in common with the peer)")
	noNIXL := fs.Bool("no-nixl", false, "do not load NIXL (print the agent metadata's size instead of the agent name)")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	addr, err := parseOne(fs, args, "address (tcp://HOST:PORT)")
	if err != nil {
		return err
	}
	if *attempts < 1 || *timeout < 0 {
		return usagef("--attempts must be at least 1 and --timeout not negative")
	}
	p, err := profileFor(*version)
	if err != nil {
		return err
	}
	if len(ranks) == 0 {
		ranks = rankList{{}}
	}
	rep := probeReport{Address: addr, VLLMVersion: *version, Profile: p.String()}
	if cf.model != "" {
		in, err := cf.inputs(p)
		if err != nil {
			return err
		}
		if rep.LocalHash, err = p.CompatHash(in); err != nil {
			return usagef("hash inputs: %v", err)
		}
		rep.LocalInputs, _ = p.FactorsJSON(in)
	}

	// A throwaway agent (no progress thread, no memory) only parses the peer's NIXL metadata.
	var agent *nixl.Agent
	if *noNIXL {
		rep.NIXL = "not loaded (--no-nixl)"
	} else if lib, err := nf.load(); err != nil {
		rep.NIXL = "not loadable here: " + firstLine(err.Error())
	} else if agent, err = lib.NewAgent(throwawayAgentName("probe"), nixl.AgentConfig{NoProgressThread: true,
		Backends: connector.ParseBackends(strings.Split(*backends, ","))}); err != nil {
		rep.NIXL = "agent with backends " + *backends + ": " + oneLine(err.Error())
		agent = nil
	} else {
		defer agent.Close()
	}

	for _, rank := range ranks {
		res, err := sidechannel.Fetch(ctx, p, addr, rank, sidechannel.FetchOptions{Timeout: *timeout, Attempts: *attempts})
		if err != nil {
			return probeError(err, addr, rank, p)
		}
		hp, err := protocol.DecodeHandshakePayload(res.Payload)
		if err != nil {
			return fmt.Errorf("rank %s at %s: %w (is --vllm-version %s what the peer runs?)", rank, addr, err, *version)
		}
		md, err := p.OpenHandshake(res.Payload, protocol.HandshakeCheck{})
		if err != nil {
			return fmt.Errorf("rank %s at %s: %w (is --vllm-version %s what the peer runs?)", rank, addr, err, *version)
		}
		rr := probeRankReport{PP: rank.PP, TP: rank.TP, RTTMillis: float64(res.RTT.Microseconds()) / 1000,
			PayloadBytes: len(res.Payload), CompatibilityHash: hp.CompatibilityHash, Metadata: newMetaView(p, md)}
		if res.HasClock {
			off := res.ClockOffset
			rr.ClockOffset = &off
		}
		if rep.LocalHash != "" {
			match := hp.CompatibilityHash == rep.LocalHash
			rr.HashMatch = &match
		}
		if agent != nil {
			name, err := agent.LoadRemoteMetadata(md.AgentMetadata)
			if err != nil {
				rr.Metadata.AgentNameError = "NIXL cannot parse it: " + oneLine(err.Error())
			} else {
				rr.Metadata.AgentName = name
				_ = agent.InvalidateRemoteMetadata(name)
			}
		}
		rep.Ranks = append(rep.Ranks, rr)
	}

	if err := writeReport(env.stdout, *asJSON, rep, printProbe); err != nil {
		return err
	}
	for _, rr := range rep.Ranks {
		if rr.HashMatch != nil && !*rr.HashMatch {
			return &quietError{msg: fmt.Sprintf("rank %d,%d: compatibility hash mismatch: the peer sent %s, this configuration gives %s; "+
				"a vLLM decode worker would refuse it (check --vllm-version, --model and the other hash inputs: %s)", rr.PP, rr.TP, rr.CompatibilityHash, rep.LocalHash, rep.LocalInputs)}
		}
		if *engineID != "" && rr.Metadata.EngineID != *engineID {
			return &quietError{msg: fmt.Sprintf("rank %d,%d: engine_id is %q, not --engine-id %q", rr.PP, rr.TP, rr.Metadata.EngineID, *engineID)}
		}
	}
	return nil
}

func probeError(err error, addr string, rank protocol.Rank, p protocol.Profile) error {
	switch {
	case errors.Is(err, sidechannel.ErrTimeout):
		return fmt.Errorf("%w; is the prefill worker up, is the port reachable, and does it bind a routable host? vLLM binds localhost unless VLLM_NIXL_SIDE_CHANNEL_HOST is set", err)
	case errors.Is(err, sidechannel.ErrRejected):
		return fmt.Errorf("%s rejected the request for rank %s: %w (wrong --vllm-version? this sends %s framing; or the worker does not serve that rank)", addr, rank, err, p.Framing)
	case errors.Is(err, sidechannel.ErrConfig):
		return usagef("%v", err)
	case errors.Is(err, protocol.ErrMalformed):
		return fmt.Errorf("%s sent a reply %s cannot read for rank %s: %w (wrong --vllm-version?)", addr, p, rank, err)
	}
	return fmt.Errorf("rank %s at %s: %w", rank, addr, err)
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return strings.TrimSuffix(strings.TrimSpace(s[:i]), ":")
	}
	return s
}

func printProbe(w io.Writer, rep probeReport) {
	fmt.Fprintf(w, "peer                   %s (%s)\n", rep.Address, rep.Profile)
	if rep.NIXL != "" {
		fmt.Fprintf(w, "NIXL                   %s\n", rep.NIXL)
	}
	for _, rr := range rep.Ranks {
		fmt.Fprintf(w, "rank pp=%d tp=%d          rtt %.3f ms, payload %d bytes", rr.PP, rr.TP, rr.RTTMillis, rr.PayloadBytes)
		if rr.ClockOffset != nil {
			fmt.Fprintf(w, ", clock offset %+.6f s", *rr.ClockOffset)
		}
		fmt.Fprintln(w)
		h := rr.CompatibilityHash
		if h == "" {
			h = "(none: this profile's payload has no hash)"
		}
		switch {
		case rr.HashMatch == nil:
			fmt.Fprintf(w, "  %-22s %s\n", "compatibility_hash", h)
		case *rr.HashMatch:
			fmt.Fprintf(w, "  %-22s %s (matches the local configuration)\n", "compatibility_hash", h)
		default:
			fmt.Fprintf(w, "  %-22s %s (MISMATCH: local configuration gives %s)\n", "compatibility_hash", h, rep.LocalHash)
		}
		rr.Metadata.print(w, "  ")
	}
}
