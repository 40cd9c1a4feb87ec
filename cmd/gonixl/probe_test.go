package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gonixl/gonixl/connector/protocol"
	"github.com/gonixl/gonixl/internal/testenv"
)

func hashArgs(in protocol.CompatInputs) []string {
	return []string{"--model", in.Model, "--dtype", in.Dtype, "--kv-heads", strconv.FormatInt(in.NumKVHeads, 10),
		"--head-size", strconv.FormatInt(in.HeadSize, 10), "--layers", strconv.FormatInt(in.NumHiddenLayers, 10),
		"--attn-backend", in.AttnBackendName, "--cache-dtype", in.CacheDtype, "--hma=" + strconv.FormatBool(in.HMAEnabled)}
}

func TestProbe(t *testing.T) {
	dir := nixlDir(t)
	for _, v := range []string{"0.16.0", "0.33.0"} {
		t.Run(v, func(t *testing.T) {
			pre, cache := startPrefill(t, v)
			addr := fmt.Sprintf("tcp://127.0.0.1:%d", pre.Port())

			// JSON, with the hash inputs of the server's configuration: everything it advertises, hash matching.
			args := append([]string{"probe", addr, "--vllm-version", v, "--nixl-lib-dir", dir, "--json", "--timeout", "2s",
				"--engine-id", pre.EngineID()}, hashArgs(testModel)...)
			r := runCLI(t, args...)
			require.Equal(t, 0, r.code, r.stderr)
			rep := decodeJSON[probeReport](t, r.stdout)
			require.Len(t, rep.Ranks, 1)
			rr := rep.Ranks[0]
			require.NotNil(t, rr.HashMatch)
			require.True(t, *rr.HashMatch)
			require.Len(t, rr.CompatibilityHash, 64)
			require.Equal(t, rep.LocalHash, rr.CompatibilityHash)
			md := rr.Metadata
			require.Equal(t, pre.EngineID(), md.EngineID)
			require.Equal(t, pre.Agent().Name(), md.AgentName, "the NIXL agent name, parsed by NIXL from the blob")
			require.Positive(t, md.AgentMetadataBytes)
			g := cache.Geometry()
			require.Equal(t, int64(g.NumBlocks), md.NumBlocks)
			require.Equal(t, int64(g.BlockSize), md.BlockSize)
			require.Equal(t, g.BlockLens(), md.BlockLens)
			prof, err := protocol.ProfileFor(v)
			require.NoError(t, err)
			wantLabel, err := prof.LayoutName(g.Order) // "HND" up to 0.28, "LBHNC" from 0.29
			require.NoError(t, err)
			require.Equal(t, wantLabel, md.KVCacheLayout)
			require.Len(t, md.Regions, g.NumRegions())
			var total int64
			for i, reg := range md.Regions {
				require.Equal(t, cache.RegionBases()[i], reg.BaseInt)
				require.Equal(t, fmt.Sprintf("0x%x", cache.RegionBases()[i]), reg.Base)
				require.Equal(t, int64(g.NumBlocks)*g.BlockLen(), reg.Len)
				total += reg.Len
			}
			require.Equal(t, int64(len(cache.Bytes())), total)
			if v == "0.33.0" {
				require.NotNil(t, rr.ClockOffset, "H4 framing sends the server's clock")
			}

			// Text output says the same.
			r = runCLI(t, "probe", addr, "--vllm-version", v, "--nixl-lib-dir", dir)
			require.Equal(t, 0, r.code, r.stderr)
			require.Contains(t, r.stdout, pre.EngineID())
			require.Contains(t, r.stdout, pre.Agent().Name())
			require.Contains(t, r.stdout, fmt.Sprintf("%#016x", cache.RegionBases()[0]))

			// Without NIXL: the blob's size instead of the agent name.
			r = runCLI(t, "probe", addr, "--vllm-version", v, "--no-nixl", "--json")
			require.Equal(t, 0, r.code, r.stderr)
			rep = decodeJSON[probeReport](t, r.stdout)
			require.Empty(t, rep.Ranks[0].Metadata.AgentName)
			require.Equal(t, md.AgentMetadataBytes, rep.Ranks[0].Metadata.AgentMetadataBytes)

			// Another model: the report is printed, then one line and exit status 1.
			other := testModel
			other.Model = "test/other"
			r = runCLI(t, append([]string{"probe", addr, "--vllm-version", v, "--no-nixl"}, hashArgs(other)...)...)
			require.Contains(t, r.stdout, "MISMATCH")
			requireOneLine(t, r, exitError, "compatibility hash mismatch", `"model": "test/other"`) // + our hash inputs

			r = runCLI(t, "probe", addr, "--vllm-version", v, "--no-nixl", "--engine-id", "someone-else")
			requireOneLine(t, r, exitError, "someone-else")

			// A rank the worker does not serve.
			r = runCLI(t, "probe", addr, "--vllm-version", v, "--no-nixl", "--rank", "0,3", "--timeout", "2s")
			requireOneLine(t, r, exitError, "rejected")
		})
	}
}

func TestProbeWrongVersion(t *testing.T) {
	pre, _ := startPrefill(t, "0.33.0")
	addr := fmt.Sprintf("127.0.0.1:%d", pre.Port())
	// A 0.16 request (H2 framing) to a 0.33 worker: refused with a hint at --vllm-version.
	r := runCLI(t, "probe", addr, "--vllm-version", "0.16.0", "--no-nixl", "--timeout", "2s", "--attempts", "1")
	requireOneLine(t, r, exitError, "--vllm-version")
}

func TestProbeUnreachable(t *testing.T) {
	// A port nobody listens on.
	addr := testenv.RefusedAddr(t)
	r := runCLI(t, "probe", "tcp://"+addr, "--vllm-version", "0.16.0", "--no-nixl", "--timeout", "200ms", "--attempts", "1")
	requireOneLine(t, r, exitError, "no reply", "is the prefill worker up")

	r = runCLI(t, "probe", "not an address", "--vllm-version", "0.16.0", "--no-nixl", "--timeout", "200ms", "--attempts", "1")
	require.NotEqual(t, 0, r.code)
	requireOneLine(t, r, r.code)
}

// A vLLM-style prefill worker in Python (the NIXL wheel's Python API, vLLM's side-channel framing, and vLLM's
// own handshake classes and hash when its wheel is available) probed by the CLI.
func TestProbePythonPrefill(t *testing.T) {
	dir := nixlDir(t)
	py := testenv.Python(t)
	testenv.PythonModules(t, py, "msgspec", "zmq", "numpy", "nixl_cu12")
	script := filepath.Join(testenv.RepoRoot(), "python", "vllm_prefill_peer.py")
	const layers, heads, headDim, blockSize, numBlocks = 2, 2, 64, 16, 32
	for _, p := range protocol.Profiles {
		t.Run(p.Name, func(t *testing.T) {
			in := protocol.CompatInputs{VLLMVersion: p.MinVersion, Model: "gonixl/test-tiny", Dtype: "torch.bfloat16", NumKVHeads: heads,
				HeadSize: headDim, NumHiddenLayers: layers, AttnBackendName: "FLASH_ATTN", CacheDtype: "auto", HMAEnabled: true}
			hash, err := p.CompatHash(in)
			require.NoError(t, err)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, py, script, "--profile", p.Name, "--layers", fmt.Sprint(layers), "--heads", fmt.Sprint(heads),
				"--head-dim", fmt.Sprint(headDim), "--block-size", fmt.Sprint(blockSize), "--model", in.Model, "--hash", hash,
				"--seed", "7", "--num-blocks", fmt.Sprint(numBlocks), "--timeout", "30")
			child := testenv.StartChild(t, cmd, false)
			rd, stderr := child.Stdout, child.Stderr
			var hello struct {
				EngineID string          `json:"engine_id"`
				Hash     string          `json:"hash"`
				Params   json.RawMessage `json:"kv_transfer_params"`
			}
			for {
				line, err := rd.ReadString('\n')
				require.NoError(t, err, "python prefill peer: %s", stderr.String())
				if strings.HasPrefix(line, "{") {
					require.NoError(t, json.Unmarshal([]byte(line), &hello), line)
					break
				}
			}
			require.Equal(t, hash, hello.Hash, "Go's hash is vLLM's")
			kv, err := p.DecodeParams(hello.Params)
			require.NoError(t, err)

			args := append([]string{"probe", fmt.Sprintf("tcp://%s:%d", kv.RemoteHost, kv.RemotePort), "--vllm-version", p.MinVersion,
				"--nixl-lib-dir", dir, "--json", "--timeout", "5s", "--engine-id", hello.EngineID}, hashArgs(in)...)
			r := runCLI(t, args...)
			require.Equal(t, 0, r.code, "%s; python: %s", r.stderr, stderr.String())
			rep := decodeJSON[probeReport](t, r.stdout)
			rr := rep.Ranks[0]
			require.True(t, *rr.HashMatch)
			require.Equal(t, hash, rr.CompatibilityHash)
			md := rr.Metadata
			require.Equal(t, hello.EngineID, md.EngineID)
			require.Regexp(t, `^[0-9a-f]{8}-[0-9a-f]{4}-`, md.AgentName, "the Python agent's name (a uuid4), read by NIXL")
			regions, blockLen := 2*layers, int64(blockSize*heads*headDim*2)
			if p.Layout != protocol.LayoutA { // eras B and C: one region per layer, K and V in each block
				regions, blockLen = layers, 2*blockLen
			}
			require.Len(t, md.Regions, regions)
			require.EqualValues(t, numBlocks, md.NumBlocks)
			require.EqualValues(t, blockSize, md.BlockSize)
			for i, reg := range md.Regions {
				require.Equal(t, numBlocks*blockLen, reg.Len)
				if i > 0 {
					require.Equal(t, md.Regions[i-1].BaseInt+uint64(reg.Len), reg.BaseInt, "numpy arena, regions back to back")
				}
			}
		})
	}
}
