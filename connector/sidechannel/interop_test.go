package sidechannel

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gonixl/gonixl/connector/protocol"
	"github.com/gonixl/gonixl/internal/testenv"
)

// vectorsFor loads the vLLM-generated vectors of a profile (field order and msgspec-made payloads).
type interopVectors struct {
	VLLMVersion    string   `json:"vllm_version"`
	Profile        string   `json:"profile"`
	MetadataFields []string `json:"metadata_fields"`
	Payload        []struct {
		Name string `json:"name"`
		Hash string `json:"hash"`
		Hex  string `json:"hex"`
	} `json:"payload"`
}

func vectorsFor(t *testing.T, profile string) interopVectors {
	files, err := filepath.Glob(filepath.Join(testenv.RepoRoot(), "testdata", "vllm", "*", "vectors.json"))
	require.NoError(t, err)
	for _, f := range files {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		var v interopVectors
		require.NoError(t, json.Unmarshal(b, &v))
		if v.Profile == profile {
			return v
		}
	}
	t.Fatalf("no vectors for profile %s: run `make vectors`", profile)
	return interopVectors{}
}

func pythonPeer(t *testing.T) (string, string) {
	py := testenv.Python(t)
	testenv.PythonModules(t, py, "msgspec", "zmq")
	return py, filepath.Join(testenv.RepoRoot(), "python", "sidechannel_peer.py")
}

// A Python client with vLLM's decode-side framing asks the Go ROUTER server for every rank.
func TestInteropPythonClientGoServer(t *testing.T) {
	py, peer := pythonPeer(t)
	for _, p := range protocol.Profiles {
		t.Run(p.Name, func(t *testing.T) {
			vec := vectorsFor(t, p.Name)
			hash := vec.Payload[0].Hash
			pps := 1
			if p.Framing == protocol.FramingH4 {
				pps = 2
			}
			payloads := servePayloads(t, p, hash, pps, 2)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			srv := startServer(t, p, ServerConfig{Payloads: payloads})

			var ranks []string
			for r := range payloads {
				ranks = append(ranks, fmt.Sprintf("%d:%d", r.PP, r.TP))
			}
			cmd := exec.CommandContext(ctx, py, peer, "client", "--profile", p.Name, "--endpoint", srv.Endpoint(),
				"--ranks", strings.Join(ranks, ","))
			out, err := cmd.Output()
			require.NoError(t, err, "python client: %s", testenv.ExitStderr(err))
			lines := strings.Split(strings.TrimSpace(string(out)), "\n")
			require.Len(t, lines, len(ranks))
			for _, line := range lines {
				var got struct {
					PP, TP         int
					Frames         int      `json:"frames"`
					Clock          *float64 `json:"clock"`
					PayloadHex     string   `json:"payload_hex"`
					Hash           string   `json:"hash"`
					MetadataKeys   []string `json:"metadata_keys"`
					EngineID       string   `json:"engine_id"`
					Typed          bool     `json:"typed"`
					TypedEngineID  string   `json:"typed_engine_id"`
					TypedNumBlocks int64    `json:"typed_num_blocks"`
				}
				require.NoError(t, json.Unmarshal([]byte(line), &got), line)
				r := protocol.Rank{PP: got.PP, TP: got.TP}
				assert.Equal(t, hex.EncodeToString(payloads[r]), got.PayloadHex, "rank %v", r)
				if p.Framing == protocol.FramingH4 {
					assert.Equal(t, 2, got.Frames)
					assert.NotNil(t, got.Clock)
				} else {
					assert.Equal(t, 1, got.Frames)
				}
				assert.Equal(t, hash, got.Hash)
				assert.Equal(t, vec.MetadataFields, got.MetadataKeys, "Go's field order must be vLLM's")
				assert.Equal(t, fmt.Sprintf("engine-%d", got.PP), got.EngineID)
				if got.Typed {
					assert.Equal(t, got.EngineID, got.TypedEngineID)
					assert.Equal(t, int64(64), got.TypedNumBlocks)
				} else {
					t.Logf("vLLM %s wheel not available locally (VLLM_WHEEL_DIR): decoded untyped only", vec.VLLMVersion)
				}
			}
			assert.Equal(t, uint64(len(ranks)), srv.Stats().Served)
		})
	}
}

// The Go REQ client asks a Python ROUTER with vLLM's listener framing; the payloads were made by real msgspec.
func TestInteropGoClientPythonServer(t *testing.T) { goClientAgainst(t, "server") }

// The Go REQ client asks vLLM's own _nixl_handshake_listener, loaded from the release's wheel.
func TestInteropGoClientVLLMListener(t *testing.T) { goClientAgainst(t, "vllm-server") }

func goClientAgainst(t *testing.T, mode string) {
	py, peer := pythonPeer(t)
	for _, p := range protocol.Profiles {
		t.Run(p.Name, func(t *testing.T) {
			vec := vectorsFor(t, p.Name)
			if mode == "vllm-server" && !ciWheels(t)[vec.VLLMVersion] {
				// Not testenv.Missing: this is a choice, not a missing dependency, so it skips under CI too.
				t.Skipf("vLLM %s is not in VLLM_VERSIONS (the wheels CI downloads, 0.3–0.5 GB each); its bytes are "+
					"covered by testdata/vllm/%s/vectors.json and TestInteropGoClientPythonServer", vec.VLLMVersion, vec.VLLMVersion)
			}
			ranks := []protocol.Rank{{TP: 0}, {TP: 1}}
			if p.Framing == protocol.FramingH4 {
				ranks = append(ranks, protocol.Rank{PP: 1, TP: 0})
			}
			files := map[string]string{}
			want := map[protocol.Rank]int{}
			for i, r := range ranks {
				j := i % len(vec.Payload)
				files[fmt.Sprintf("%d:%d", r.PP, r.TP)] = vec.Payload[j].Hex
				want[r] = j
			}
			pf := filepath.Join(t.TempDir(), "payloads.json")
			b, _ := json.Marshal(files)
			require.NoError(t, os.WriteFile(pf, b, 0o600))

			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			args := []string{peer, mode, "--profile", p.Name, "--payloads", pf}
			if mode == "server" {
				args = append(args, "--fast-poll")
			}
			srv, ep, err := startPyServer(t, ctx, py, args...)
			if err != nil {
				_ = srv.stop() // its stderr is complete once it exited
				if strings.Contains(srv.stderr.String(), "NO_WHEEL") {
					testenv.Missing(t, "the vLLM "+vec.VLLMVersion+" wheel", "set VLLM_WHEEL_DIR or run `make vectors` (downloads it)")
				}
			}
			require.NoError(t, err, "python server: %s", srv.stderr.String())

			res, err := FetchAll(ctx, p, ep, ranks, FetchOptions{Timeout: 5 * time.Second})
			require.NoError(t, err)
			for _, r := range res {
				pv := vec.Payload[want[r.Rank]]
				assert.Equal(t, pv.Hex, hex.EncodeToString(r.Payload), "rank %v", r.Rank)
				assert.Equal(t, p.Framing == protocol.FramingH4, r.HasClock)
				m, err := p.OpenHandshake(r.Payload, protocol.HandshakeCheck{LocalHash: pv.Hash, EnforceHash: true})
				require.NoError(t, err)
				assert.NotEmpty(t, m.EngineID)
				// The opt-out: a different local hash fails unless enforcement is off.
				_, err = p.OpenHandshake(r.Payload, protocol.HandshakeCheck{LocalHash: "other", EnforceHash: true})
				assert.ErrorIs(t, err, protocol.ErrHashMismatch)
				_, err = p.OpenHandshake(r.Payload, protocol.HandshakeCheck{LocalHash: "other", EnforceHash: false})
				assert.NoError(t, err)
			}
			require.NoError(t, srv.stop(), "python server: %s", srv.stderr.String())
			if mode == "server" {
				assert.Contains(t, srv.stderr.String(), fmt.Sprintf(`"served": %d`, len(ranks)))
			} else {
				assert.Contains(t, srv.stderr.String(), `"listener_alive": false`, "vLLM's listener stops on its stop event")
			}
		})
	}
}

// ciWheels returns the vLLM releases whose wheels `make vllm-wheels` fetches: $VLLM_VERSIONS when set, else the
// Makefile's VLLM_VERSIONS default. Only those run against vLLM's own listener.
func ciWheels(t *testing.T) map[string]bool {
	list := os.Getenv("VLLM_VERSIONS")
	if list == "" {
		b, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "Makefile"))
		require.NoError(t, err)
		for _, line := range strings.Split(string(b), "\n") {
			if name, val, ok := strings.Cut(line, "?="); ok && strings.TrimSpace(name) == "VLLM_VERSIONS" {
				list = val
				break
			}
		}
		require.NotEmpty(t, strings.TrimSpace(list), "no VLLM_VERSIONS in the Makefile")
	}
	out := map[string]bool{}
	for _, v := range strings.Fields(list) {
		out[v] = true
	}
	return out
}

// pyServer is a Python peer that prints its endpoint as the first line of its stdout and runs until its stdin
// closes.
type pyServer struct {
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	stderr  *testenv.Buffer
	once    sync.Once
	waitErr error
}

// startPyServer starts py with args and returns the peer's first line of output, trimmed; err says why there
// is none (stop, then read stderr). The peer is stopped at the end of the test at the latest.
func startPyServer(t *testing.T, ctx context.Context, py string, args ...string) (*pyServer, string, error) {
	t.Helper()
	c := testenv.StartChild(t, exec.CommandContext(ctx, py, args...), true)
	s := &pyServer{cmd: c.Cmd, stdin: c.Stdin, stderr: c.Stderr}
	t.Cleanup(func() { _ = s.stop() })
	line, err := c.Stdout.ReadString('\n')
	return s, strings.TrimSpace(line), err
}

// stop closes the peer's stdin (its signal to exit) and waits for it to exit; every call returns the exit's error.
func (s *pyServer) stop() error {
	s.once.Do(func() {
		_ = s.stdin.Close()
		s.waitErr = s.cmd.Wait()
	})
	return s.waitErr
}
