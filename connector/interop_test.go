package connector

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gonixl/gonixl/connector/protocol"
	"github.com/gonixl/gonixl/internal/testenv"
)

// pyPeer returns the test interpreter and the path of a Python peer script, or fails/skips the test.
func pyPeer(t *testing.T, script string) (string, string) {
	t.Helper()
	testLib(t)
	py := testenv.Python(t)
	testenv.PythonModules(t, py, "msgspec", "zmq", "numpy", "nixl_cu12")
	return py, filepath.Join(testenv.RepoRoot(), "python", script)
}

// pyModelArgs are the tiny model's arguments of the Python peers, plus the Go side's compatibility hash
// (used by a peer only when vLLM's wheel is not available to compute it with vLLM's own function).
func pyModelArgs(t *testing.T, p protocol.Profile) []string {
	h, err := p.CompatHash(tinyCompat(p).CompatInputs)
	require.NoError(t, err)
	return []string{"--profile", p.Name, "--layers", fmt.Sprint(tinyLayers), "--heads", fmt.Sprint(tinyHeads),
		"--head-dim", fmt.Sprint(tinyHeadDim), "--block-size", fmt.Sprint(tinyBlock), "--model", tinyModel, "--hash", h}
}

type pyDecodeResult struct {
	OK          bool    `json:"ok"`
	Error       string  `json:"error"`
	HashSource  string  `json:"hash_source"`
	LocalHash   string  `json:"local_hash"`
	RemoteHash  string  `json:"remote_hash"`
	RemoteAgent string  `json:"remote_agent"`
	Blocks      int     `json:"blocks"`
	Bytes       int64   `json:"bytes"`
	BadBlocks   int     `json:"bad_blocks"`
	Notif       string  `json:"notif"`
	TransferS   float64 `json:"transfer_s"`
}

// A Python decode worker using the NIXL wheel's Python API the way vLLM does (add_remote_agent,
// prep_xfer_dlist, make_prepped_xfer, transfer, check_xfer_state, send_notif) and vLLM's side-channel framing
// and msgspec classes reads a request from the Go prefill role, verifies every byte, and its notification
// frees the Go side's blocks; on 0.33 its heartbeat is counted.
func TestInteropPythonDecodeGoPrefill(t *testing.T) {
	py, script := pyPeer(t, "vllm_decode_peer.py")
	for _, p := range roleProfiles() {
		t.Run(p.Name, func(t *testing.T) {
			pr := newPair(t, p, pairOpts{})
			ctx := testenv.Context(t, 60*time.Second)
			kv := pr.prefill(t, ctx, "py-dec-1", 40, 21)
			raw, err := p.EncodeParams(kv)
			require.NoError(t, err)

			args := append([]string{script}, pyModelArgs(t, p)...)
			args = append(args, "--params", string(raw), "--seed", "21", "--num-blocks", "16")
			if p.Leases {
				args = append(args, "--heartbeat")
			}
			out, err := exec.CommandContext(ctx, py, args...).Output()
			require.NoError(t, err, "python decode peer: %s %s", out, testenv.ExitStderr(err))
			var res pyDecodeResult
			require.NoError(t, json.Unmarshal(jsonLine(out), &res), string(out))
			require.True(t, res.OK, "python decode peer: %s", out)
			assert.Zero(t, res.BadBlocks)
			assert.Equal(t, 3, res.Blocks)
			assert.Equal(t, kv.RemoteRequestID+":1", res.Notif, "the remote_request_id echoed verbatim, suffix included")
			assert.Equal(t, res.LocalHash, res.RemoteHash)
			if res.HashSource == "vllm" {
				t.Logf("compatibility hash checked with vLLM %s's own compute_nixl_compatibility_hash", p.MinVersion)
			} else {
				t.Logf("vLLM %s wheel not available: hash compared with the Go value", p.MinVersion)
			}
			t.Logf("python READ of %d bytes in %.3f ms", res.Bytes, res.TransferS*1e3)

			require.Eventually(t, func() bool { return pr.pre.Held() == 0 }, 30*time.Second, 5*time.Millisecond)
			assert.EqualValues(t, 3, pr.preM.BlocksFreed())
			assert.EqualValues(t, 1, pr.preM.Notifications())
			assert.Zero(t, pr.preM.BadMessages())
			assert.Zero(t, pr.pre.pool.InUse())
			if p.Leases {
				assert.EqualValues(t, 1, pr.preM.Heartbeats())
			}
		})
	}
}

// A Python decode worker of another model refuses the Go prefill role's handshake (vLLM's hash check), and the
// Go side, never notified, frees the blocks at expiry.
func TestInteropPythonDecodeHashMismatch(t *testing.T) {
	py, script := pyPeer(t, "vllm_decode_peer.py")
	p, _ := protocol.ProfileByName("0.33")
	pr := newPair(t, p, pairOpts{hold: 500 * time.Millisecond})
	ctx := testenv.Context(t, 60*time.Second)
	kv, err := pr.pre.Hold(ctx, "py-mismatch", 16, nil)
	require.NoError(t, err)
	raw, err := p.EncodeParams(kv)
	require.NoError(t, err)
	args := append([]string{script}, pyModelArgs(t, p)...)
	args = append(args, "--params", string(raw), "--seed", "1", "--model", "gonixl/another-model", "--hash", "not-the-go-hash")
	out, err := exec.CommandContext(ctx, py, args...).Output()
	var ee *exec.ExitError
	require.ErrorAs(t, err, &ee)
	assert.Equal(t, 3, ee.ExitCode(), "%s %s", out, ee.Stderr)
	var res pyDecodeResult
	require.NoError(t, json.Unmarshal(jsonLine(out), &res), string(out))
	assert.Contains(t, res.Error, "compatibility hash mismatch")
	require.Eventually(t, func() bool { return pr.pre.Held() == 0 }, 30*time.Second, 5*time.Millisecond)
	assert.EqualValues(t, 1, pr.preM.RequestsExpired())
}

// The mirror case: a Python prefill worker (NIXL wheel API, vLLM's ROUTER framing and msgspec payload with
// vLLM's own hash) serves one request; the Go decode role handshakes, checks the hash, reads the blocks and
// notifies, and the Python side receives "<request_id>:1".
func TestInteropGoDecodePythonPrefill(t *testing.T) {
	py, script := pyPeer(t, "vllm_prefill_peer.py")
	for _, p := range roleProfiles() {
		t.Run(p.Name, func(t *testing.T) {
			ctx := testenv.Context(t, 60*time.Second)
			args := append([]string{script}, pyModelArgs(t, p)...)
			args = append(args, "--seed", "33", "--tokens", "40", "--num-blocks", "32", "--request-id", "py-pre-1", "--timeout", "30")
			child := testenv.StartChild(t, exec.CommandContext(ctx, py, args...), false)
			rd, stderr := child.Stdout, child.Stderr
			line, err := readJSONLine(rd)
			require.NoError(t, err, "python prefill peer: %s", stderr.String())
			var hello struct {
				EngineID   string          `json:"engine_id"`
				Hash       string          `json:"hash"`
				HashSource string          `json:"hash_source"`
				Params     json.RawMessage `json:"kv_transfer_params"`
			}
			require.NoError(t, json.Unmarshal([]byte(line), &hello), line)
			kv, err := p.DecodeParams(hello.Params)
			require.NoError(t, err)
			want, _ := p.CompatHash(tinyCompat(p).CompatInputs)
			assert.Equal(t, want, hello.Hash, "Go's compatibility hash must be vLLM's (%s)", hello.HashSource)

			dlog, dlogs := observed()
			dc := newCache(t, tinyGeom(t, p, 16))
			m := &Metrics{}
			d, err := NewDecode(DecodeConfig{RoleConfig: RoleConfig{Profile: p, Library: testLib(t), Cache: dc, Compat: tinyCompat(p), Metrics: m, Logger: dlog}})
			require.NoError(t, err)
			t.Cleanup(func() { require.NoError(t, d.Close()) })
			local := []int{5, 1, 9}
			res, err := d.Pull(ctx, "go-dec-1", kv, local)
			require.NoError(t, err)
			requirePattern(t, dc, local, kv.RemoteBlockIDs[0], 33)
			assert.Equal(t, 3, res.Blocks)
			assert.Positive(t, res.Handshake)
			assert.EqualValues(t, 1, m.Handshakes())
			hs := dlogs.FilterMessage("handshake done").All()
			require.Len(t, hs, 1)
			assert.Equal(t, hello.EngineID, fieldsOf(hs[0])["remote_engine_id"])

			line, err = readJSONLine(rd)
			require.NoError(t, err, "python prefill peer: %s", stderr.String())
			var done struct {
				Notified bool   `json:"notified"`
				Msg      string `json:"msg"`
				Count    int    `json:"count"`
				Served   int    `json:"served"`
			}
			require.NoError(t, json.Unmarshal([]byte(line), &done), line)
			assert.True(t, done.Notified)
			assert.Equal(t, "py-pre-1:1", done.Msg)
			assert.Equal(t, 1, done.Served, "one handshake")
			require.NoError(t, child.Cmd.Wait())
		})
	}
}

// jsonLine returns the last line of out that is a JSON object (NIXL's Python API logs to stdout too).
func jsonLine(out []byte) []byte {
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.HasPrefix(lines[i], "{") {
			return []byte(lines[i])
		}
	}
	return out
}

// readJSONLine reads lines until one is a JSON object.
func readJSONLine(rd *bufio.Reader) (string, error) {
	for {
		line, err := rd.ReadString('\n')
		if strings.HasPrefix(line, "{") {
			return line, nil
		}
		if err != nil {
			return line, err
		}
	}
}
