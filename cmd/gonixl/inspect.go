package main

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/gonixl/gonixl/connector/protocol"
)

const inspectHelp = `Reads FILE (or stdin with -) and decodes it as one of:
  metadata  msgpack NixlAgentMetadata (what a side-channel payload carries as agent_metadata_bytes)
  payload   msgpack NixlHandshakePayload (the side-channel reply: compatibility hash + metadata)
  params    JSON kv_transfer_params (a prefill response's, or a decode request's)
The input may be raw bytes or hex text. By default every kind and every vLLM profile is tried (newest
first) and the first that decodes is printed; --kind and --vllm-version pin them.

Examples:
  gonixl inspect payload.bin
  xxd -p payload.bin | gonixl inspect - --vllm-version 0.33.0 --json
  echo '{"do_remote_prefill": true, ...}' | gonixl inspect - --kind params`

// maxInspectBytes bounds the input (a handshake payload is a few KiB per region).
const maxInspectBytes = 64 << 20

// Kinds of inspected input.
const (
	kindMetadata = "metadata"
	kindPayload  = "payload"
	kindParams   = "params"
)

type inspectReport struct {
	Kind              string      `json:"kind"`
	Profile           string      `json:"profile"`  // the profile name that decoded it ("0.33")
	Profiles          []string    `json:"profiles"` // every profile that decodes it
	InputBytes        int         `json:"input_bytes"`
	Hex               bool        `json:"input_was_hex,omitempty"`
	CompatibilityHash string      `json:"compatibility_hash,omitempty"`
	Metadata          *metaView   `json:"metadata,omitempty"`
	Params            *paramsView `json:"params,omitempty"`
	profile           protocol.Profile
}

// paramsView is a decoded kv_transfer_params.
type paramsView struct {
	Fields      map[string]json.RawMessage `json:"fields"`
	Order       []string                   `json:"-"`
	BlockGroups int                        `json:"block_id_groups"`
	Blocks      int                        `json:"block_ids"`
	DecodeReady bool                       `json:"decode_ready"`
	DecodeError string                     `json:"decode_error,omitempty"`
}

func runInspect(ctx context.Context, env *cmdEnv, args []string) error {
	fs := newFlagSet(env, inspectHelp)
	kind := fs.String("kind", "auto", "what the input is: auto, metadata, payload or params")
	version := fs.String("vllm-version", "", "decode with this vLLM version's profile only (default: try each, newest first)")
	asJSON := fs.Bool("json", false, "print the decoded object as JSON")
	file, err := parseOne(fs, args, "FILE (or - for stdin)")
	if err != nil {
		return err
	}
	switch *kind {
	case "auto", kindMetadata, kindPayload, kindParams:
	default:
		return usagef("--kind %q: want auto, metadata, payload or params", *kind)
	}
	profiles := make([]protocol.Profile, 0, len(protocol.Profiles))
	if *version != "" {
		p, err := profileFor(*version)
		if err != nil {
			return err
		}
		profiles = append(profiles, p)
	} else {
		for i := len(protocol.Profiles) - 1; i >= 0; i-- {
			profiles = append(profiles, protocol.Profiles[i])
		}
	}
	data, err := readInput(file)
	if err != nil {
		return err
	}
	rep, err := inspectBytes(data, *kind, profiles)
	if err != nil {
		return err
	}
	return writeReport(env.stdout, *asJSON, rep, printInspect)
}

func readInput(name string) ([]byte, error) {
	var r io.Reader
	if name == "-" {
		r = os.Stdin
	} else {
		f, err := os.Open(name)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		r = f
	}
	b, err := io.ReadAll(io.LimitReader(r, maxInspectBytes+1))
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", name, err)
	}
	if len(b) > maxInspectBytes {
		return nil, fmt.Errorf("%s is larger than %s; that is no handshake object", name, humanBytes(maxInspectBytes))
	}
	if len(b) == 0 {
		return nil, fmt.Errorf("%s is empty", name)
	}
	return b, nil
}

// inspectBytes decodes data as kind ("auto" tries params, payload, metadata) with the first of profiles that
// accepts it. It never panics, whatever data holds.
func inspectBytes(data []byte, kind string, profiles []protocol.Profile) (inspectReport, error) {
	rep := inspectReport{InputBytes: len(data)}
	if b, ok := fromHex(data); ok {
		data, rep.Hex = b, true
	}
	kinds := []string{kind}
	if kind == "auto" {
		if t := bytes.TrimSpace(data); len(t) > 0 && t[0] == '{' {
			kinds = []string{kindParams}
		} else {
			kinds = []string{kindPayload, kindMetadata}
		}
	}
	var errs []string
	for _, k := range kinds {
		var err error
		switch k {
		case kindPayload:
			err = inspectPayload(&rep, data, profiles)
		case kindMetadata:
			err = inspectMetadata(&rep, data, profiles)
		case kindParams:
			err = inspectParams(&rep, data, profiles)
		}
		if err == nil {
			rep.Kind = k
			return rep, nil
		}
		errs = append(errs, k+": "+oneLine(err.Error()))
	}
	what := map[string]string{kindMetadata: "a NixlAgentMetadata", kindPayload: "a NixlHandshakePayload", kindParams: "kv_transfer_params"}
	var names []string
	for _, k := range kinds {
		names = append(names, what[k])
	}
	var pn []string
	for _, p := range profiles {
		pn = append(pn, p.Name)
	}
	return rep, fmt.Errorf("not %s of vLLM %s (%s)", strings.Join(names, " or "), strings.Join(pn, "/"), strings.Join(errs, "; "))
}

// fromHex decodes input that is entirely hex text (whitespace and an optional 0x prefix allowed).
func fromHex(data []byte) ([]byte, bool) {
	t := bytes.Join(bytes.Fields(data), nil)
	t = bytes.TrimPrefix(bytes.TrimPrefix(t, []byte("0x")), []byte("0X"))
	if len(t) < 2 || len(t)%2 != 0 {
		return nil, false
	}
	out := make([]byte, len(t)/2)
	if _, err := hex.Decode(out, t); err != nil {
		return nil, false
	}
	return out, true
}

func inspectMetadata(rep *inspectReport, data []byte, profiles []protocol.Profile) error {
	return decodeEach(rep, profiles, func(p protocol.Profile) (protocol.AgentMetadata, error) { return p.DecodeMetadata(data) },
		func(p protocol.Profile, m protocol.AgentMetadata) error {
			v := newMetaView(p, m)
			rep.Metadata = &v
			return nil
		})
}

// decodeEach decodes the input with each profile in turn (decode). The first profile that accepts it is the
// report's (use sees what it decoded); rep.Profiles lists every one that does. When none does, it returns the
// first profile's error.
func decodeEach[T any](rep *inspectReport, profiles []protocol.Profile, decode func(protocol.Profile) (T, error),
	use func(protocol.Profile, T) error) error {
	var first error
	found := false
	for _, p := range profiles {
		v, err := decode(p)
		if err != nil {
			if first == nil {
				first = fmt.Errorf("vLLM %s: %w", p.Name, err)
			}
			continue
		}
		if !found {
			if err := use(p, v); err != nil {
				return err
			}
			rep.Profile, rep.profile, found = p.Name, p, true
		}
		rep.Profiles = append(rep.Profiles, p.Name)
	}
	if !found {
		return first
	}
	return nil
}

func inspectPayload(rep *inspectReport, data []byte, profiles []protocol.Profile) error {
	hp, err := protocol.DecodeHandshakePayload(data)
	if err != nil {
		return err
	}
	if err := inspectMetadata(rep, hp.AgentMetadataBytes, profiles); err != nil {
		return fmt.Errorf("a NixlHandshakePayload whose agent_metadata_bytes do not decode: %w", err)
	}
	rep.CompatibilityHash = hp.CompatibilityHash
	return nil
}

func inspectParams(rep *inspectReport, data []byte, profiles []protocol.Profile) error {
	return decodeEach(rep, profiles, func(p protocol.Profile) (protocol.KVTransferParams, error) { return p.DecodeParams(data) },
		func(p protocol.Profile, k protocol.KVTransferParams) error {
			var raw map[string]json.RawMessage
			if err := json.Unmarshal(data, &raw); err != nil {
				return err
			}
			v := paramsView{Fields: raw, BlockGroups: len(k.RemoteBlockIDs)}
			for _, g := range k.RemoteBlockIDs {
				v.Blocks += len(g)
			}
			seen := map[string]bool{}
			for _, key := range p.ParamsKeys {
				if _, ok := raw[key]; ok {
					v.Order = append(v.Order, key)
					seen[key] = true
				}
			}
			for _, key := range sortedKeys(raw) {
				if !seen[key] {
					v.Order = append(v.Order, key)
				}
			}
			if err := k.ValidateForDecode(); err != nil {
				v.DecodeError = oneLine(err.Error())
			} else {
				v.DecodeReady = true
			}
			rep.Params = &v
			return nil
		})
}

func printInspect(w io.Writer, rep inspectReport) {
	what := map[string]string{kindMetadata: "NixlAgentMetadata", kindPayload: "NixlHandshakePayload", kindParams: "kv_transfer_params"}[rep.Kind]
	src := fmt.Sprintf("%d bytes", rep.InputBytes)
	if rep.Hex {
		src += " of hex"
	}
	fmt.Fprintf(w, "%-22s %s (%s)\n", "kind", what, src)
	also := ""
	if len(rep.Profiles) > 1 {
		also = " (also decodes as " + strings.Join(rep.Profiles[1:], ", ") + ")"
	}
	fmt.Fprintf(w, "%-22s %s%s\n", "profile", rep.profile, also)
	if rep.Kind == kindPayload {
		fmt.Fprintf(w, "%-22s %s\n", "compatibility_hash", rep.CompatibilityHash)
	}
	if rep.Metadata != nil {
		rep.Metadata.print(w, "")
	}
	if p := rep.Params; p != nil {
		width := 22
		for _, k := range p.Order {
			width = max(width, len(k))
		}
		for _, k := range p.Order {
			fmt.Fprintf(w, "%-*s %s\n", width, k, p.Fields[k])
		}
		if p.DecodeReady {
			fmt.Fprintf(w, "%-*s yes (%d block ids in %d group(s))\n", width, "usable by a decoder", p.Blocks, p.BlockGroups)
		} else {
			fmt.Fprintf(w, "%-*s no: %s\n", width, "usable by a decoder", p.DecodeError)
		}
	}
}
