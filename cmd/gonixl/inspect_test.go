package main

import (
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gonixl/gonixl/connector/protocol"
	"github.com/gonixl/gonixl/internal/testenv"
)

// vectors is the part of testdata/vllm/<version>/vectors.json (generated from vLLM's wheels) used here.
type vectors struct {
	Profile  string `json:"profile"`
	Metadata []struct {
		Name   string         `json:"name"`
		Hex    string         `json:"hex"`
		Fields map[string]any `json:"fields"`
	} `json:"metadata"`
	MetadataDecode []struct {
		Name  string  `json:"name"`
		Hex   string  `json:"hex"`
		Error *string `json:"error"`
	} `json:"metadata_decode"`
	Payload []struct {
		Name     string `json:"name"`
		Hash     string `json:"hash"`
		Metadata string `json:"metadata"`
		Hex      string `json:"hex"`
	} `json:"payload"`
	Params []struct {
		Name string `json:"name"`
		JSON string `json:"json"`
	} `json:"params"`
}

func loadVectors(t testing.TB, version string) vectors {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "testdata", "vllm", version, "vectors.json"))
	require.NoError(t, err)
	var v vectors
	require.NoError(t, json.Unmarshal(b, &v))
	require.NotEmpty(t, v.Metadata)
	return v
}

func unhex(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	require.NoError(t, err)
	return b
}

func writeFile(t *testing.T, name string, b []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	require.NoError(t, os.WriteFile(p, b, 0o644))
	return p
}

func TestInspectVectors(t *testing.T) {
	for _, version := range []string{"0.16.0", "0.33.0"} {
		v := loadVectors(t, version)
		t.Run(version, func(t *testing.T) {
			for _, m := range v.Metadata {
				// Raw bytes, pinned to the version: every field as vLLM wrote it.
				r := runCLI(t, "inspect", writeFile(t, m.Name+".bin", unhex(t, m.Hex)), "--vllm-version", version, "--json")
				require.Equal(t, 0, r.code, "%s: %s", m.Name, r.stderr)
				rep := decodeJSON[inspectReport](t, r.stdout)
				require.Equal(t, kindMetadata, rep.Kind)
				require.Equal(t, v.Profile, rep.Profile)
				md := rep.Metadata
				require.Equal(t, m.Fields["engine_id"], md.EngineID, m.Name)
				require.EqualValues(t, m.Fields["num_blocks"], md.NumBlocks, m.Name)
				require.EqualValues(t, m.Fields["block_size"], md.BlockSize, m.Name)
				require.Equal(t, m.Fields["kv_cache_layout"], md.KVCacheLayout, m.Name)
				bases := m.Fields["kv_caches_base_addr"].([]any)
				require.Len(t, md.Regions, len(bases), m.Name)
				for i, b := range bases {
					require.EqualValues(t, b, md.Regions[i].BaseInt, m.Name)
				}
				require.Len(t, md.BlockLens, len(m.Fields["block_lens"].([]any)))

				// Hex text, auto-detected kind and profile: the newest profile that accepts it is this one
				// (a 0.33 blob also decodes as 0.16, whose decoder skips the newer keys; not the reverse).
				r = runCLI(t, "inspect", writeFile(t, m.Name+".hex", []byte(m.Hex+"\n")), "--json")
				require.Equal(t, 0, r.code, "%s: %s", m.Name, r.stderr)
				rep = decodeJSON[inspectReport](t, r.stdout)
				require.True(t, rep.Hex)
				require.Equal(t, kindMetadata, rep.Kind)
				require.Equal(t, v.Profile, rep.Profile, m.Name)
			}
			for _, p := range v.Payload {
				r := runCLI(t, "inspect", writeFile(t, p.Name, unhex(t, p.Hex)), "--json")
				require.Equal(t, 0, r.code, "%s: %s", p.Name, r.stderr)
				rep := decodeJSON[inspectReport](t, r.stdout)
				require.Equal(t, kindPayload, rep.Kind)
				require.Equal(t, p.Hash, rep.CompatibilityHash)
				require.Equal(t, v.Profile, rep.Profile, p.Name)

				r = runCLI(t, "inspect", writeFile(t, p.Name, unhex(t, p.Hex)))
				require.Equal(t, 0, r.code, r.stderr)
				require.Contains(t, r.stdout, "NixlHandshakePayload")
				require.Contains(t, r.stdout, p.Hash)
			}
			prof, err := protocol.ProfileFor(version)
			require.NoError(t, err)
			for _, p := range v.Params {
				r := runCLI(t, "inspect", writeFile(t, p.Name+".json", []byte(p.JSON)), "--json")
				require.Equal(t, 0, r.code, "%s: %s", p.Name, r.stderr)
				rep := decodeJSON[inspectReport](t, r.stdout)
				require.Equal(t, kindParams, rep.Kind)
				require.Contains(t, rep.Profiles, prof.Name, "the profile the vector was made with decodes it")
				k, err := prof.DecodeParams([]byte(p.JSON))
				require.NoError(t, err)
				require.Equal(t, k.ValidateForDecode() == nil, rep.Params.DecodeReady, p.Name)
				for key := range k.Has {
					require.Contains(t, rep.Params.Fields, key)
				}
			}
			// The decode vectors: those vLLM accepts decode, those it refuses are refused in one line.
			for _, d := range v.MetadataDecode {
				r := runCLI(t, "inspect", writeFile(t, d.Name, unhex(t, d.Hex)), "--kind", "metadata", "--vllm-version", version)
				if d.Error == nil {
					require.Equal(t, 0, r.code, "%s: %s", d.Name, r.stderr)
				} else {
					requireOneLine(t, r, exitError, "not a NixlAgentMetadata of vLLM "+v.Profile)
				}
			}
		})
	}
}

func TestInspectStdinAndErrors(t *testing.T) {
	v := loadVectors(t, "0.16.0")
	// stdin
	f := writeFile(t, "payload.hex", []byte(v.Payload[0].Hex))
	in, err := os.Open(f)
	require.NoError(t, err)
	defer in.Close()
	old := os.Stdin
	os.Stdin = in
	r := runCLI(t, "inspect", "-")
	os.Stdin = old
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "NixlHandshakePayload")

	requireOneLine(t, runCLI(t, "inspect", writeFile(t, "garbage", []byte("\x00\x01garbage\xff"))), exitError,
		"not a NixlHandshakePayload or a NixlAgentMetadata")
	requireOneLine(t, runCLI(t, "inspect", writeFile(t, "bad.json", []byte(`{"remote_block_ids": "x"}`))), exitError, "kv_transfer_params")
	requireOneLine(t, runCLI(t, "inspect", writeFile(t, "empty", nil)), exitError, "empty")
	requireOneLine(t, runCLI(t, "inspect", filepath.Join(t.TempDir(), "missing")), exitError, "no such file")
	requireOneLine(t, runCLI(t, "inspect"), exitUsage, "FILE")
	requireOneLine(t, runCLI(t, "inspect", f, "--kind", "blob"), exitUsage, "--kind")
	// Wrong version: a 0.16 payload is not a 0.33 one (0.33 requires fields 0.16 never sends).
	r = runCLI(t, "inspect", f, "--vllm-version", "0.33.0")
	requireOneLine(t, r, exitError, "vLLM 0.33")
	// A payload pinned to metadata is refused, and the reverse.
	requireOneLine(t, runCLI(t, "inspect", f, "--kind", "metadata"), exitError, "NixlAgentMetadata")
	md := writeFile(t, "md.hex", []byte(v.Metadata[0].Hex))
	requireOneLine(t, runCLI(t, "inspect", md, "--kind", "payload"), exitError, "NixlHandshakePayload")
	require.Equal(t, 0, runCLI(t, "inspect", md, "--kind", "metadata").code)
	r = runCLI(t, "inspect", md)
	require.Equal(t, 0, r.code)
	require.True(t, strings.HasPrefix(r.stdout, "kind"), r.stdout)
}

// FuzzInspect feeds arbitrary bytes to the decoder behind `gonixl inspect`: it must never panic, and whatever
// it accepts must be one of the three kinds, with a profile.
func FuzzInspect(f *testing.F) {
	for _, version := range []string{"0.16.0", "0.33.0"} {
		v := loadVectors(f, version)
		for _, m := range v.Metadata {
			f.Add(unhex(f, m.Hex))
			f.Add([]byte(m.Hex))
		}
		for _, d := range v.MetadataDecode {
			f.Add(unhex(f, d.Hex))
		}
		for _, p := range v.Payload {
			f.Add(unhex(f, p.Hex))
		}
		for _, p := range v.Params {
			f.Add([]byte(p.JSON))
		}
	}
	var all []protocol.Profile
	for i := len(protocol.Profiles) - 1; i >= 0; i-- {
		all = append(all, protocol.Profiles[i])
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, kind := range []string{"auto", kindMetadata, kindPayload, kindParams} {
			rep, err := inspectBytes(b, kind, all)
			if err != nil {
				continue
			}
			switch rep.Kind {
			case kindMetadata, kindPayload:
				require.NotNil(t, rep.Metadata)
			case kindParams:
				require.NotNil(t, rep.Params)
			default:
				t.Fatalf("kind %q", rep.Kind)
			}
			require.NotEmpty(t, rep.Profile)
			printInspect(discard{}, rep)
		}
	})
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }
