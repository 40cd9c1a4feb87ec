package connector_test

// The real-vLLM tier: vLLM's OWN NixlConnector — its scheduler side (side channel, what to send and when to
// free) and its worker side (NIXL registration, handshake, READ, notifications, heartbeats, lease expiry) —
// on vLLM's CPU platform with the real NIXL wheel, driven by python/vllm_real_driver.py the way vLLM's engine
// drives it, against gonixl's public Prefill and Decode roles, in both directions. The releases are those of
// GONIXL_VLLM_VERSIONS (default: the oldest and newest supported, 0.16.0 and 0.33.0), each in the venv
// scripts/vllm-venv.sh made under GONIXL_VLLM_VENVS (default ~/.cache/gonixl/venvs); `make test` creates
// them, `make interop VLLM=<version>` runs one release.

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gonixl/gonixl/connector"
	"github.com/gonixl/gonixl/connector/protocol"
	"github.com/gonixl/gonixl/connector/sidechannel"
	"github.com/gonixl/gonixl/internal/nixltest"
	"github.com/gonixl/gonixl/internal/testenv"
	"github.com/gonixl/gonixl/layout"
	"github.com/gonixl/gonixl/nixl"
)

// The model: Qwen3-0.6B's attention geometry (8 KV heads of 128, bf16) from a config.json the test writes (no
// weights), with 4 layers instead of 28 to keep the caches small; vLLM's CPU_ATTN backend needs a block size
// that is a multiple of 32.
const (
	realLayers    = 4
	realKVHeads   = 8
	realHeadDim   = 128
	realBlockSize = 32
	realBlocks    = 64
)

const qwen3Config = `{"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 1024,
 "intermediate_size": 3072, "num_attention_heads": 16, "num_key_value_heads": %d, "head_dim": %d,
 "num_hidden_layers": %d, "vocab_size": 151936, "max_position_embeddings": 40960, "rms_norm_eps": 1e-06,
 "rope_theta": 1000000, "torch_dtype": "bfloat16", "tie_word_embeddings": true, "hidden_act": "silu",
 "attention_bias": false, "bos_token_id": 151643, "eos_token_id": 151645}`

// vllmVersions are the releases the tier runs.
func vllmVersions() []string { return versionsFrom("GONIXL_VLLM_VERSIONS", "0.16.0", "0.33.0") }

// versionsFrom returns the releases listed in the environment variable env, else defaults.
func versionsFrom(env string, defaults ...string) []string {
	if v := strings.Fields(os.Getenv(env)); len(v) > 0 {
		return v
	}
	return defaults
}

// vllmPython returns the interpreter of a release's venv, or fails (CI) / skips the test.
func vllmPython(t testing.TB, version string) string {
	return venvPython(t, "vllm-"+version, "the vLLM "+version+" venv", "run `make vllm-venvs` or `scripts/vllm-venv.sh "+version+"`")
}

// venvPython returns the interpreter of the venv GONIXL_VLLM_VENVS/name (default ~/.cache/gonixl/venvs) once
// its completion stamp is there, or fails (CI) / skips the test saying what and fix.
func venvPython(t testing.TB, name, what, fix string) string {
	t.Helper()
	return testenv.VenvPython(t, name, what, fix)
}

// realModel writes the model folder; its path is vLLM's model name, hashed as "model".
func realModel(t *testing.T) string { return writeModel(t, "qwen3-0.6b-4l", realLayers) }

// writeModel writes a model folder named name with the tier's model of the given number of layers.
func writeModel(t testing.TB, name string, layers int) string {
	dir := filepath.Join(t.TempDir(), name)
	require.NoError(t, os.MkdirAll(dir, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "config.json"), []byte(fmt.Sprintf(qwen3Config, realKVHeads, realHeadDim, layers)), 0o644))
	return dir
}

// realCompat is what a user states: the vLLM release (p, from ProfileFor of the peer's version string) and
// platform of the peer (gonixl fills vLLM's defaults: HMA, attention backend, cache dtype, transfer mode) and the
// model's values.
func realCompat(p protocol.Profile, model string) connector.Compat {
	in := p.DefaultCompatInputs(protocol.PlatformCPU)
	in.Model, in.Dtype = model, "torch.bfloat16"
	in.NumKVHeads, in.HeadSize, in.NumHiddenLayers = realKVHeads, realHeadDim, realLayers
	return connector.Compat{CompatInputs: in}
}

func realGeom(t *testing.T, p protocol.Profile) layout.Geometry {
	return realGeomN(t, p, realLayers, realBlocks)
}

func realGeomN(t testing.TB, p protocol.Profile, layers, numBlocks int) layout.Geometry {
	// vLLM's CPU platform holds CPU_ATTN blocks (bf16: the vec packing on CPUs without AMX tiles; this tier
	// compares bytes, which CPU_ATTN's packing does not change).
	m := connector.Model{Layers: layers, KVHeads: realKVHeads, HeadDim: realHeadDim, DType: layout.BF16, BlockSize: realBlockSize,
		AttnBackend: protocol.AttnBackendCPU, Order: layout.CPUAttn}
	g, err := m.Geometry(p, numBlocks, 1)
	require.NoError(t, err)
	return g
}

// blockHashes is the driver's hashes(): per block, sha256 over the block's bytes in every region, in order.
func blockHashes(c *connector.DRAMCache, blocks []int) []string {
	g := c.Geometry()
	bl := int(g.BlockLen())
	out := make([]string, len(blocks))
	for i, b := range blocks {
		h := sha256.New()
		for r := 0; r < g.NumRegions(); r++ {
			h.Write(c.Region(r)[b*bl : (b+1)*bl])
		}
		out[i] = hex.EncodeToString(h.Sum(nil))
	}
	return out
}

// randomFill is a FillFunc writing random bytes into every region of the blocks.
func randomFill(c *connector.DRAMCache) connector.FillFunc {
	return func(_ context.Context, blocks []int) error {
		bl := int(c.Geometry().BlockLen())
		for r := 0; r < c.Geometry().NumRegions(); r++ {
			for _, b := range blocks {
				if _, err := rand.Read(c.Region(r)[b*bl : (b+1)*bl]); err != nil {
					return err
				}
			}
		}
		return nil
	}
}

// event is one JSON line of the driver.
type event struct {
	Event      string          `json:"event"`
	Error      string          `json:"error"`
	ReqID      string          `json:"req_id"`
	Version    string          `json:"version"`
	EngineID   string          `json:"engine_id"`
	Port       int             `json:"port"` // ready: the side channel's port (rank 0)
	Hash       *string         `json:"compat_hash"`
	Layout     string          `json:"kv_cache_layout"`
	Backend    string          `json:"backend"`
	Regions    int             `json:"num_regions"`
	BlockLen   int64           `json:"block_len"`
	ImportS    float64         `json:"import_s"`
	Params     json.RawMessage `json:"kv_transfer_params"`
	Hashes     []string        `json:"hashes"`
	Blocks     []int           `json:"blocks"`
	OK         bool            `json:"ok"`
	Seconds    float64         `json:"seconds"`
	AfterS     float64         `json:"after_s"`
	Expired    int             `json:"expired"`
	Extended   int             `json:"lease_extended"`
	HBs        int             `json:"heartbeats"`
	HBsRecv    int             `json:"heartbeats_received"`
	RankHashes [][]string      `json:"rank_hashes"`
	LoadErrs   []int           `json:"load_errors"`
	HandshakeS float64         `json:"handshake_s"` // vLLM's decode: its handshakes since the last pull (BenchmarkVLLMSideBySide)
	ReadS      float64         `json:"read_s"`      // vLLM's decode: first READ posted to the last seen done
	Xfers      int             `json:"xfers"`       // vLLM's decode: READ requests posted
	raw        string
}

// driver is one vLLM instance (python/vllm_real_driver.py) in its own process.
type driver struct {
	t       testing.TB
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	events  chan event
	stderr  *testenv.Buffer
	pending []event
	ready   event
}

func startDriver(t testing.TB, ctx context.Context, python, role, model string, numBlocks int, args ...string) *driver {
	t.Helper()
	return startDrivers(t, ctx, func(ctx context.Context, distPort int) []*driver {
		return []*driver{launchDriver(t, ctx, python, role, model, numBlocks, append([]string{"--dist-port", fmt.Sprint(distPort)}, args...)...)}
	}, loopbackPort)[0]
}

// startDrivers launches drivers (the ranks of one vLLM instance, which join each other's process group at
// distPort) and waits until each is ready. The port of torch's process-group store must be known to every
// rank before the first binds it, so it is picked free and may be taken by another program meanwhile (a busy
// machine): when a driver reports EADDRINUSE before it is ready, the attempt is killed and redone with a fresh
// port (3 attempts). pick gives each attempt's port (tests give a taken one first). The side channel's port is
// the driver's own business (python/vllm_real_driver.py rebinds on EADDRINUSE).
func startDrivers(t testing.TB, ctx context.Context, launch func(ctx context.Context, distPort int) []*driver, pick func(t testing.TB, attempt int) int) []*driver {
	t.Helper()
	for attempt := 1; ; attempt++ {
		actx, cancel := context.WithCancel(ctx)
		t.Cleanup(cancel) // after the drivers' own cleanups (LIFO): they quit first
		ds := launch(actx, pick(t, attempt))
		var err error
		for _, d := range ds {
			if d.ready, err = d.awaitReady(ctx); err != nil {
				break
			}
		}
		if err == nil {
			return ds
		}
		cancel() // kills this attempt's drivers
		if !addrInUse(err) || attempt == 3 {
			require.FailNow(t, "vLLM driver failed to start", "attempt %d: %v", attempt, err)
		}
		t.Logf("attempt %d: a port was taken between picking and binding it (%v); again with a fresh one", attempt, err)
	}
}

// loopbackPort picks a free loopback port for a child to bind (startDrivers retries if it is taken meanwhile).
func loopbackPort(t testing.TB, _ int) int {
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// addrInUse reports whether an error names a port already bound (torch's DistNetworkError, zmq's ZMQError).
func addrInUse(err error) bool { return inUseText(err.Error()) }

// inUseText reports whether a message (an error's, a child's stderr) names a port already bound.
func inUseText(s string) bool {
	m := strings.ToLower(s)
	return strings.Contains(m, "eaddrinuse") || strings.Contains(m, "address already in use")
}

// awaitReady waits for the driver's "ready" event; an "error" event or the driver's exit is returned as an
// error, for the caller to decide.
func (d *driver) awaitReady(ctx context.Context) (event, error) {
	for {
		select {
		case e, ok := <-d.events:
			if !ok {
				return event{}, fmt.Errorf("vLLM driver exited before it was ready: %s", d.stderr.Tail(3000))
			}
			switch e.Event {
			case "error":
				return event{}, fmt.Errorf("vLLM driver error: %s\n%s", e.Error, d.stderr.Tail(3000))
			case "ready":
				return e, nil
			}
			d.pending = append(d.pending, e)
		case <-ctx.Done():
			return event{}, fmt.Errorf("timed out waiting for the driver to be ready: %s", d.stderr.Tail(3000))
		}
	}
}

func launchDriver(t testing.TB, ctx context.Context, python, role, model string, numBlocks int, args ...string) *driver {
	t.Helper()
	script := filepath.Join(testenv.RepoRoot(), "python", "vllm_real_driver.py")
	cmd := exec.CommandContext(ctx, python, append([]string{script, "--role", role, "--model", model,
		"--block-size", fmt.Sprint(realBlockSize), "--num-blocks", fmt.Sprint(numBlocks)}, args...)...)
	cmd.Env = append(os.Environ(), "VLLM_TARGET_DEVICE=cpu", "PYTHONUNBUFFERED=1")
	child := testenv.StartChild(t, cmd, true)
	d := &driver{t: t, cmd: cmd, events: make(chan event, 64), stderr: child.Stderr, stdin: child.Stdin}
	stdout := child.Stdout
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		defer close(d.events)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 1<<20), 16<<20)
		for sc.Scan() {
			var e event
			if json.Unmarshal(sc.Bytes(), &e) == nil {
				e.raw = sc.Text()
				d.events <- e
			}
		}
	}()
	t.Cleanup(func() {
		_, _ = io.WriteString(d.stdin, `{"cmd":"quit"}`+"\n")
		_ = d.stdin.Close()
		exited := make(chan struct{})
		go func() {
			for range d.events { // drain until the driver closes stdout
			}
			<-readDone
			close(exited)
		}()
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		_ = cmd.Wait()
	})
	return d
}

func (d *driver) send(cmd map[string]any) {
	d.t.Helper()
	b, err := json.Marshal(cmd)
	require.NoError(d.t, err)
	_, err = d.stdin.Write(append(b, '\n'))
	require.NoError(d.t, err, "driver stdin: %s", d.stderr.Tail(4000))
}

// next returns the next event of the kind (and request id, when given); an "error" event fails the test.
func (d *driver) next(ctx context.Context, kind, reqID string) event {
	d.t.Helper()
	match := func(e event) bool { return e.Event == kind && (reqID == "" || e.ReqID == reqID) }
	for i, e := range d.pending {
		if match(e) {
			d.pending = append(d.pending[:i], d.pending[i+1:]...)
			return e
		}
	}
	for {
		select {
		case e, ok := <-d.events:
			if !ok {
				require.FailNow(d.t, "vLLM driver exited", "waiting for %q: %s", kind, d.stderr.Tail(3000))
			}
			if e.Event == "error" {
				require.FailNow(d.t, "vLLM driver error", "%s\n%s", e.Error, d.stderr.Tail(3000))
			}
			if match(e) {
				return e
			}
			d.pending = append(d.pending, e)
		case <-ctx.Done():
			require.FailNow(d.t, "timed out", "waiting for %q %s: %s", kind, reqID, d.stderr.Tail(3000))
		}
	}
}

// release is one vLLM release of the tier: its version string, the interpreter of its venv, and its profile.
type release struct {
	version string
	py      string
	p       protocol.Profile
}

// eachRelease runs fn as a subtest per release of vllmVersions.
func eachRelease(t *testing.T, fn func(t *testing.T, r release)) {
	for _, v := range vllmVersions() {
		t.Run(v, func(t *testing.T) {
			py := vllmPython(t, v)
			p, err := protocol.ProfileFor(v)
			require.NoError(t, err)
			fn(t, release{version: v, py: py, p: p})
		})
	}
}

// closeAtEnd closes c at the end of the test, failing it if Close fails.
func closeAtEnd(t testing.TB, c interface{ Close() error }) {
	t.Cleanup(func() { require.NoError(t, c.Close()) })
}

// realCache allocates a DRAM cache of geometry g, closed at the end of the test.
func realCache(t testing.TB, g layout.Geometry) *connector.DRAMCache {
	c, err := connector.NewDRAMCache(g, false)
	require.NoError(t, err)
	closeAtEnd(t, c)
	return c
}

// startPrefill and startDecode start gonixl's roles, closed at the end of the test (before the caches made
// earlier).
func startPrefill(t testing.TB, cfg connector.PrefillConfig) *connector.Prefill {
	pre, err := connector.NewPrefill(cfg)
	require.NoError(t, err)
	closeAtEnd(t, pre)
	return pre
}

func startDecode(t testing.TB, cfg connector.DecodeConfig) *connector.Decode {
	dec, err := connector.NewDecode(cfg)
	require.NoError(t, err)
	closeAtEnd(t, dec)
	return dec
}

// prefill has vLLM's prefill instance prefill a request (its KV filled from seed) and returns the "params" event.
func (d *driver) prefill(ctx context.Context, reqID string, tokens, seed int) event {
	d.t.Helper()
	d.send(map[string]any{"cmd": "prefill", "req_id": reqID, "num_tokens": tokens, "seed": seed})
	return d.next(ctx, "params", reqID)
}

// pull has vLLM's decode instance read a request with P's kv_transfer_params (holding it waiting for hold
// first) and returns the "pulled" event.
func (d *driver) pull(ctx context.Context, reqID string, tokens int, params json.RawMessage, hold time.Duration) event {
	d.t.Helper()
	d.send(map[string]any{"cmd": "pull", "req_id": reqID, "num_tokens": tokens, "kv_transfer_params": params,
		"hold_s": hold.Seconds()})
	return d.next(ctx, "pulled", reqID)
}

// decodeParams decodes the kv_transfer_params of vLLM's "params" event.
func decodeParams(t testing.TB, p protocol.Profile, ev event) protocol.KVTransferParams {
	t.Helper()
	kv, err := p.DecodeParams(ev.Params)
	require.NoError(t, err, "vLLM's kv_transfer_params: %s", ev.Params)
	return kv
}

// encodeParams encodes gonixl's kv_transfer_params for vLLM's decode.
func encodeParams(t *testing.T, p protocol.Profile, kv protocol.KVTransferParams) json.RawMessage {
	t.Helper()
	raw, err := p.EncodeParams(kv)
	require.NoError(t, err)
	return raw
}

// TestVLLMReal runs vLLM's own NixlConnector against gonixl's roles, per release, both directions at once
// (one vLLM process per direction).
func TestVLLMReal(t *testing.T) {
	lib := nixltest.Lib(t)
	eachRelease(t, func(t *testing.T, r release) {
		model := realModel(t)
		t.Run("vllm-decode-gonixl-prefill", func(t *testing.T) {
			t.Parallel()
			vllmDecodeGoPrefill(t, lib, r, model)
		})
		t.Run("gonixl-decode-vllm-prefill", func(t *testing.T) {
			t.Parallel()
			goDecodeVLLMPrefill(t, lib, r, model)
		})
	})
}

// (a) vLLM decode ← gonixl prefill.
func vllmDecodeGoPrefill(t *testing.T, lib *nixl.Library, r release, model string) {
	version, p := r.version, r.p
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	// vLLM's decode heartbeats every kv_lease_duration // 6 s: 1 s with a 6 s lease.
	d := startDriver(t, ctx, r.py, "decode", model, realBlocks, "--lease", "6")
	t.Logf("vLLM %s decode ready (import and setup %.1f s): backend %s, kv_cache_layout %q, %d regions of %d-byte blocks",
		d.ready.Version, d.ready.ImportS, d.ready.Backend, d.ready.Layout, d.ready.Regions, d.ready.BlockLen)
	require.Equal(t, version, d.ready.Version)
	compat := realCompat(p, model)
	if d.ready.Hash != nil {
		want, err := p.CompatHash(compat.CompatInputs)
		require.NoError(t, err)
		require.Equal(t, *d.ready.Hash, want, "gonixl's compatibility hash for %+v must be vLLM's", compat.CompatInputs)
	}
	g := realGeom(t, p)
	require.Equal(t, d.ready.Regions, g.NumRegions(), "registered regions")
	require.Equal(t, d.ready.BlockLen, g.BlockLen(), "bytes per block and region")

	newPrefill := func(hold time.Duration) (*connector.Prefill, *connector.DRAMCache, *connector.Metrics) {
		c := realCache(t, g)
		m := &connector.Metrics{}
		pre := startPrefill(t, connector.PrefillConfig{RoleConfig: connector.RoleConfig{Profile: p, Library: lib, Cache: c, Compat: compat, Metrics: m, EngineID: fmt.Sprintf("gonixl-prefill-%s-%d", version, time.Now().UnixNano())}, HoldTimeout: hold})
		return pre, c, m
	}
	pre, c, m := newPrefill(0) // vLLM's defaults: lease or abort timeout
	pull := func(id string, kv protocol.KVTransferParams, tokens int, hold time.Duration) event {
		return d.pull(ctx, "vllm-"+id, tokens, encodeParams(t, p, kv), hold)
	}

	// Two requests, block size 32: 100 tokens (4 blocks, the last partial) and 600 (19 blocks).
	for i, tokens := range []int{100, 600} {
		id := fmt.Sprintf("req-%d", i)
		kv, err := pre.Hold(ctx, id, tokens, randomFill(c))
		require.NoError(t, err)
		want := blockHashes(c, int64sToInts(kv.RemoteBlockIDs[0]))
		res := pull(id, kv, tokens, 0)
		require.True(t, res.OK, "vLLM's worker reported the READ failed: %s", res.raw)
		require.Empty(t, res.LoadErrs)
		require.Len(t, res.Hashes, (tokens+realBlockSize-1)/realBlockSize)
		assert.Equal(t, want, res.Hashes, "vLLM received other bytes than gonixl's blocks held")
		// vLLM's notification frees the blocks, not the expiry.
		require.Eventually(t, func() bool { return pre.Held() == 0 }, time.Minute, 10*time.Millisecond)
		assert.EqualValues(t, i+1, m.Notifications())
		assert.Zero(t, m.RequestsExpired())
		assert.Zero(t, m.BadMessages())
		t.Logf("request %s: vLLM %s read %d blocks in %.3f s (after scheduling)", id, version, len(res.Hashes), res.Seconds)
	}

	// Leases: vLLM's decode holds the request (waiting in its queue) for longer than gonixl's hold and sends
	// heartbeats meanwhile; gonixl's prefill counts them and they keep the blocks alive until the READ.
	// gonixl's hold (8 s) must outlast the gap before vLLM's first heartbeat (its handshake, then its steps)
	// on a loaded 2-core machine: with 3 s one `make test` beside another expired the request once.
	pre2, c2, m2 := newPrefill(8 * time.Second)
	if p.Leases {
		kv, err := pre2.Hold(ctx, "hb", 64, randomFill(c2))
		require.NoError(t, err)
		want := blockHashes(c2, int64sToInts(kv.RemoteBlockIDs[0]))
		res := pull("hb", kv, 64, 16*time.Second)
		require.True(t, res.OK, res.raw)
		assert.Equal(t, want, res.Hashes)
		assert.Positive(t, res.HBs, "vLLM's decode sent no heartbeat")
		assert.Positive(t, m2.Heartbeats(), "gonixl's prefill counted no heartbeat")
		require.Eventually(t, func() bool { return pre2.Held() == 0 }, time.Minute, 10*time.Millisecond)
		assert.Zero(t, m2.RequestsExpired(), "the heartbeats did not extend the lease")
		assert.EqualValues(t, 1, m2.Notifications())
		t.Logf("vLLM sent %d heartbeats while holding the request 16 s; gonixl counted %d", res.HBs, m2.Heartbeats())
	}
	// Expiry: a request vLLM never reads is freed by gonixl at its hold timeout.
	_, err := pre2.Hold(ctx, "never-read", 64, randomFill(c2))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return pre2.Held() == 0 }, time.Minute, 10*time.Millisecond)
	assert.EqualValues(t, 1, m2.RequestsExpired())
}

// (b) gonixl decode ← vLLM prefill.
func goDecodeVLLMPrefill(t *testing.T, lib *nixl.Library, r release, model string) {
	version, p := r.version, r.p
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	const lease = 5 // kv_lease_duration of vLLM's prefill (releases with leases)
	d := startDriver(t, ctx, r.py, "prefill", model, 4*realBlocks, "--lease", fmt.Sprint(lease))
	t.Logf("vLLM %s prefill ready (import and setup %.1f s): backend %s, kv_cache_layout %q", d.ready.Version, d.ready.ImportS, d.ready.Backend, d.ready.Layout)
	require.Equal(t, version, d.ready.Version)
	compat := realCompat(p, model)
	c := realCache(t, realGeom(t, p))
	m := &connector.Metrics{}
	dec := startDecode(t, connector.DecodeConfig{RoleConfig: connector.RoleConfig{Profile: p, Library: lib, Cache: c, Compat: compat, Metrics: m}})

	next := 1
	for i, tokens := range []int{100, 600} {
		id := fmt.Sprintf("req-%d", i)
		ev := d.prefill(ctx, id, tokens, i+1)
		kv := decodeParams(t, p, ev)
		require.Len(t, kv.RemoteBlockIDs, 1)
		nb := len(kv.RemoteBlockIDs[0])
		require.Equal(t, (tokens+realBlockSize-1)/realBlockSize, nb)
		local := connector.LocalBlocks(nb, next-1)
		next += nb
		res, err := dec.Pull(ctx, "gonixl-"+id, kv, local)
		require.NoError(t, err)
		assert.Equal(t, nb, res.Blocks)
		assert.Equal(t, ev.Hashes, blockHashes(c, local), "gonixl received other bytes than vLLM's blocks held")
		// gonixl's notification makes vLLM's worker report the request done sending, before the lease / timeout.
		fin := d.next(ctx, "finished_sending", id)
		assert.Zero(t, fin.Expired, "vLLM released the request at expiry, not on gonixl's notification")
		t.Logf("request %s: gonixl read %d blocks (%d bytes) in %v; vLLM released it %.3f s after publishing",
			id, res.Blocks, res.Bytes, res.Transfer, fin.AfterS)
	}
	assert.EqualValues(t, 1, m.Handshakes(), "one handshake with vLLM's side channel")

	// Leases: gonixl's decode keeps a waiting request alive (Decode.KeepAlive: "HB:" heartbeats from the
	// moment it has the params, as vLLM's decode does for a waiting request), and vLLM's prefill extends the
	// lease: the request is read after twice vLLM's lease and released on gonixl's notification, not at expiry.
	// vLLM heartbeats every kv_lease_duration // 6 s; the lease here is 5 s, so gonixl beats every second (the
	// profile's interval is for vLLM's default 30 s lease).
	if p.Leases {
		hp := p
		hp.HeartbeatInterval = time.Second
		hm := &connector.Metrics{}
		hdec := startDecode(t, connector.DecodeConfig{RoleConfig: connector.RoleConfig{Profile: hp, Library: lib, Cache: c, Compat: compat, Metrics: hm}})
		ev := d.prefill(ctx, "hb", 100, 7)
		kv := decodeParams(t, p, ev)
		stop, err := hdec.KeepAlive(ctx, kv)
		require.NoError(t, err)
		time.Sleep(2 * lease * time.Second)
		local := connector.LocalBlocks(len(kv.RemoteBlockIDs[0]), 0)
		res, err := hdec.Pull(ctx, "gonixl-hb", kv, local)
		stop()
		require.NoError(t, err, "vLLM's prefill let the lease expire although gonixl heartbeated")
		assert.Equal(t, ev.Hashes, blockHashes(c, local))
		fin := d.next(ctx, "finished_sending", "hb")
		assert.Zero(t, fin.Expired, "vLLM released the request at expiry despite gonixl's heartbeats")
		assert.Positive(t, hm.Heartbeats(), "gonixl's decode sent no heartbeat")
		assert.Positive(t, fin.HBsRecv, "vLLM's prefill handled none of gonixl's %d heartbeats", hm.Heartbeats())
		assert.Positive(t, fin.Extended, "vLLM's prefill extended no lease on gonixl's %d heartbeats", hm.Heartbeats())
		t.Logf("gonixl kept request hb alive for %d s with %d heartbeats; vLLM's prefill handled %d and extended the lease %d times; READ %v",
			2*lease, hm.Heartbeats(), fin.HBsRecv, fin.Extended, res.Transfer)
	}

	// Expiry: a request gonixl never reads is released by vLLM's prefill at its lease (0.22+) or abort timeout.
	cmd := map[string]any{"cmd": "prefill", "req_id": "never-read", "num_tokens": 64, "seed": 9}
	wait := float64(lease)
	if !p.Leases {
		cmd["abort_timeout"] = 4 // VLLM_NIXL_ABORT_REQUEST_TIMEOUT, read by this release when the request finishes
		wait = 4
	}
	d.send(cmd)
	d.next(ctx, "params", "never-read")
	fin := d.next(ctx, "finished_sending", "never-read")
	assert.Equal(t, 1, fin.Expired, "vLLM should release the unread request at expiry")
	assert.GreaterOrEqual(t, fin.AfterS, wait-0.5)
}

func int64sToInts(v []int64) []int {
	out := make([]int, len(v))
	for i, x := range v {
		out[i] = int(x)
	}
	return out
}

// TestVLLMRealHeteroTP: vLLM's decode with tensor parallelism 2 — two worker processes, one per rank, joined
// by torch.distributed (gloo) as vLLM's executor joins them, rank 0 running the scheduler side — reads from
// gonixl's prefill with TP 1: each vLLM rank handshakes with gonixl's single rank and READs its half of the
// KV heads of every block, and gonixl frees the blocks once both ranks notified.
func TestVLLMRealHeteroTP(t *testing.T) {
	lib := nixltest.Lib(t)
	eachRelease(t, func(t *testing.T, rel release) {
		v, p := rel.version, rel.p
		model := realModel(t)
		t.Run("vllm-decode-tp2-gonixl-prefill-tp1", func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
			defer cancel()
			d := startTP2(t, ctx, rel.py, "decode", model)
			c := realCache(t, realGeom(t, p))
			m := &connector.Metrics{}
			pre := startPrefill(t, connector.PrefillConfig{RoleConfig: connector.RoleConfig{Profile: p, Library: lib, Cache: c, Compat: realCompat(p, model), Metrics: m, EngineID: fmt.Sprintf("gonixl-prefill-tp1-%s-%d", v, time.Now().UnixNano())}})
			const tokens = 300
			kv, err := pre.Hold(ctx, "tp", tokens, randomFill(c))
			require.NoError(t, err)
			res := d.pull(ctx, "vllm-tp", tokens, encodeParams(t, p, kv), 0)
			require.True(t, res.OK, res.raw)
			require.Len(t, res.RankHashes, 2)
			blocks := int64sToInts(kv.RemoteBlockIDs[0])
			for r := range 2 {
				assert.Equal(t, headHalfHashes(c, blocks, r), res.RankHashes[r], "vLLM rank %d received other bytes than its heads of gonixl's blocks", r)
			}
			require.Eventually(t, func() bool { return pre.Held() == 0 }, time.Minute, 10*time.Millisecond)
			assert.EqualValues(t, 2, m.Notifications(), "one notification per vLLM rank")
			assert.Zero(t, m.RequestsExpired())
			t.Logf("vLLM %s decode TP 2 read %d blocks from gonixl's prefill TP 1 in %.3f s", v, len(blocks), res.Seconds)
		})
		t.Run("gonixl-decode-tp1-vllm-prefill-tp2", func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
			defer cancel()
			d := startTP2(t, ctx, rel.py, "prefill", model)
			c := realCache(t, realGeom(t, p))
			dec := startDecode(t, connector.DecodeConfig{RoleConfig: connector.RoleConfig{Profile: p, Library: lib, Cache: c, Compat: realCompat(p, model), Metrics: &connector.Metrics{}}})
			ev := d.prefill(ctx, "tp", 300, 5)
			kv := decodeParams(t, p, ev)
			require.Equal(t, 2, kv.TPSize)
			local := connector.LocalBlocks(len(kv.RemoteBlockIDs[0]), 2)
			res, err := dec.Pull(ctx, "gonixl-tp", kv, local)
			require.NoError(t, err)
			require.Len(t, ev.RankHashes, 2)
			for r := range 2 {
				assert.Equal(t, ev.RankHashes[r], headHalfHashes(c, local, r), "gonixl's heads of vLLM rank %d differ from that rank's blocks", r)
			}
			fin := d.next(ctx, "finished_sending", "tp")
			assert.Zero(t, fin.Expired, "vLLM released the request at expiry, not on gonixl's notifications")
			t.Logf("gonixl decode TP 1 read %d blocks (%d bytes) from vLLM %s prefill TP 2 in %v; vLLM released it %.3f s after publishing",
				res.Blocks, res.Bytes, v, res.Transfer, fin.AfterS)
		})
	})
}

// startTP2 starts the two ranks of a vLLM instance with TP 2 (they join each other's process group before
// saying ready) and returns rank 0, which runs the scheduler side and takes the commands.
func startTP2(t *testing.T, ctx context.Context, py, role, model string) *driver {
	engineID := fmt.Sprintf("vllm-%s-tp2-%d", role, time.Now().UnixNano()) // one engine id for all its ranks
	return startDrivers(t, ctx, func(ctx context.Context, distPort int) []*driver {
		ranks := make([]*driver, 2)
		for r := range ranks {
			ranks[r] = launchDriver(t, ctx, py, role, model, realBlocks, "--engine-id", engineID,
				"--tp-size", "2", "--tp-rank", fmt.Sprint(r), "--dist-port", fmt.Sprint(distPort), "--lease", "30")
		}
		return ranks
	}, loopbackPort)[0]
}

// headHalfHashes: per block, sha256 over every region of the half of the block's bytes that holds TP rank r's
// KV heads (heads are outermost within a block in the HND layouts of this tier).
func headHalfHashes(c *connector.DRAMCache, blocks []int, r int) []string {
	g := c.Geometry()
	bl := int(g.BlockLen())
	half := bl / 2
	out := make([]string, len(blocks))
	for i, b := range blocks {
		h := sha256.New()
		for reg := 0; reg < g.NumRegions(); reg++ {
			h.Write(c.Region(reg)[b*bl+r*half : b*bl+(r+1)*half])
		}
		out[i] = hex.EncodeToString(h.Sum(nil))
	}
	return out
}

// TestVLLMRealPortTaken: the ports a vLLM driver binds are taken by another program when it binds them (what
// a busy machine does between picking a port free and the child binding it; issue 22 saw EADDRINUSE from
// torch's process-group store and zmq's side channel). The first attempt's process-group port is held here:
// the driver reports EADDRINUSE and startDrivers starts it again on a fresh port; the side-channel port is held
// for every attempt: the driver binds another and reports it. Before the fix the first failure failed the
// test (and a taken side-channel port hung vLLM's start-up). Run on the first release only (one start-up).
func TestVLLMRealPortTaken(t *testing.T) {
	v := vllmVersions()[0]
	py := vllmPython(t, v)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	hold := func() (int, func()) {
		l, err := net.Listen("tcp4", "127.0.0.1:0")
		require.NoError(t, err)
		return l.Addr().(*net.TCPAddr).Port, func() { _ = l.Close() }
	}
	distTaken, freeDist := hold()
	defer freeDist()
	sideTaken, freeSide := hold()
	defer freeSide()
	model := realModel(t)
	attempts := 0
	d := startDrivers(t, ctx, func(ctx context.Context, distPort int) []*driver {
		return []*driver{launchDriver(t, ctx, py, "prefill", model, realBlocks, "--dist-port", fmt.Sprint(distPort),
			"--side-port", fmt.Sprint(sideTaken))}
	}, func(t testing.TB, attempt int) int {
		attempts = attempt
		if attempt == 1 {
			return distTaken
		}
		return loopbackPort(t, attempt)
	})[0]
	assert.Equal(t, 2, attempts, "the first attempt's process-group port was taken")
	require.NotZero(t, d.ready.Port)
	assert.NotEqual(t, sideTaken, d.ready.Port, "the driver moved its side channel off the taken port")
	// The side channel it reports serves vLLM's handshake.
	p, err := protocol.ProfileFor(v)
	require.NoError(t, err)
	res, err := sidechannel.Fetch(ctx, p, net.JoinHostPort("127.0.0.1", fmt.Sprint(d.ready.Port)), protocol.Rank{}, sidechannel.FetchOptions{Timeout: 30 * time.Second})
	require.NoError(t, err)
	require.NotEmpty(t, res.Payload)
}
