// Package benchpeer runs the DRAM side of a NIXL benchmark in its own process, as a prefill worker's agent
// is in production (two agents of one process talk through shared memory and hide what the network path
// costs). The test binary re-executes itself as the peer role Role (internal/testenv's convention): TestMain serves
// Main under Role, and Start launches the peer.
package benchpeer

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/gonixl/gonixl/internal/poll"
	"github.com/gonixl/gonixl/internal/testenv"
	"github.com/gonixl/gonixl/nixl"
)

// helloPrefix starts the peer's hello line (UCX may print to stdout too, e.g. with UCX_PROTO_INFO=y).
const helloPrefix = "GONIXL_BENCH_PEER "

// Role is the peer role (testenv.Peers) under which a test binary serves Main.
const Role = "benchpeer"

// The peer's parameters (testenv.PeerParam).
const (
	paramDevice  = "DEVICE"
	paramSize    = "BYTES"
	paramUCX     = "UCX"
	paramPin     = "PIN"
	paramRegions = "REGIONS"
)

// PinHost, when set (by a package with a GPU, before Main runs), page-locks the peer's DRAM buffer for CUDA
// when Start asked for it (Options.Pin), as a prefill worker holding a CUDA context can do with its staging
// arena. It returns the function that unpins it.
var PinHost func(addr uintptr, size uint64) (unpin func() error, err error)

// Options are Start's choices for the peer.
type Options struct {
	// Device runs the peer inside Main's device function (a CUDA context current).
	Device bool
	// Pin page-locks the peer's buffer for CUDA (PinHost; needs Device).
	Pin bool
	// Regions registers the buffer as that many parts (Split), as a KV cache registers one descriptor per
	// region; 0 or 1: one.
	Regions int
}

// RegionAlign is what the parts of Split are a multiple of (every block length a benchmark reads).
const RegionAlign = 64 << 10

// Split cuts [addr, addr+size) into n parts of a multiple of RegionAlign each (the last takes the rest), as
// the peer registers its buffer with Options.Regions (n ≤ 1: the whole).
func Split(addr, size uint64, n int) []nixl.Desc {
	if n <= 1 {
		return []nixl.Desc{{Addr: addr, Len: size}}
	}
	part := size / uint64(n) / RegionAlign * RegionAlign
	out := make([]nixl.Desc, n)
	for i := range out {
		out[i] = nixl.Desc{Addr: addr + uint64(i)*part, Len: part}
	}
	out[n-1].Len = size - uint64(n-1)*part
	return out
}

// Hello is the peer's one line on stdout: its agent, NIXL metadata and registered DRAM buffer.
type Hello struct {
	Agent    string `json:"agent"`
	Metadata []byte `json:"metadata"`
	Addr     uint64 `json:"addr"`
	Len      uint64 `json:"len"`
	Error    string `json:"error,omitempty"`
}

// Pattern is the byte the peer writes at offset i of its buffer.
func Pattern(i uint64) byte { return byte(i*131 + i>>12 + 7) }

// Main is the peer process's main (testenv.Peers{Role: Main(device)}): it serves one Start and returns the exit
// status.
// device, when not nil, runs the peer's whole life (agent, registration, progress loop) inside it when Start
// asked for a device context (WithDevice): a package with a GPU passes a function that binds the GPU's context
// to the calling OS thread, as a prefill worker holding a CUDA context would have it.
func Main(device func(run func() error) error) func() int {
	return func() int {
		run := func() error { return serve(testenv.PeerParam(paramSize), testenv.PeerParam(paramUCX)) }
		var err error
		if device != nil && testenv.PeerParam(paramDevice) != "" {
			err = device(run)
		} else {
			err = run()
		}
		if err != nil {
			_ = writeHello(Hello{Error: err.Error()})
			return 1
		}
		return 0
	}
}

func serve(sizeS, paramsS string) error {
	n, err := strconv.ParseInt(sizeS, 10, 64)
	if err != nil || n <= 0 {
		return fmt.Errorf("bad peer parameter %s %q", paramSize, sizeS)
	}
	var params map[string]string
	if paramsS != "" {
		if err := json.Unmarshal([]byte(paramsS), &params); err != nil {
			return err
		}
	}
	lib, err := nixl.Load(nixl.LoadOptions{})
	if err != nil {
		return err
	}
	// The target polls for notifications every 50 µs, like the prefill role: it must keep progressing for
	// UCX's rendezvous protocols (RMA pipeline), and a poll serves TCP reads faster than a sleeping thread.
	a, err := lib.NewAgent(fmt.Sprintf("benchpeer-%d", os.Getpid()), nixl.AgentConfig{NoProgressThread: true,
		Backends: []nixl.BackendSpec{{Plugin: "UCX", Params: params}}})
	if err != nil {
		return err
	}
	defer a.Close()
	// The memory a prefill cache would have (connector's DRAM caches ask for huge pages): a READ from it is
	// the strongest baseline.
	m, err := nixl.AllocHost(n, nixl.HostOptions{HugePages: true})
	if err != nil {
		return err
	}
	defer m.Close()
	if testenv.PeerParam(paramPin) != "" {
		if PinHost == nil {
			return fmt.Errorf("peer parameter %s set but this binary has no benchpeer.PinHost", paramPin)
		}
		unpin, err := PinHost(uintptr(m.Addr()), uint64(n))
		if err != nil {
			return err
		}
		defer unpin()
	}
	b := m.Bytes()
	for i := range b {
		b[i] = Pattern(uint64(i))
	}
	reg, err := a.RegisterMem(nixl.DRAM, Split(m.Addr(), uint64(n), testenv.PeerParamInt(paramRegions)))
	if err != nil {
		return err
	}
	defer reg.Close()
	md, err := a.LocalMetadata()
	if err != nil {
		return err
	}
	if err := writeHello(Hello{Agent: a.Name(), Metadata: md, Addr: m.Addr(), Len: uint64(n)}); err != nil {
		return err
	}
	done := make(chan struct{})
	go func() { _, _ = io.Copy(io.Discard, os.Stdin); close(done) }()
	for {
		select {
		case <-done:
			return nil
		default:
		}
		if _, err := a.GetNotifications(); err != nil {
			return err
		}
		poll.Sleep(50 * time.Microsecond) // a Go timer would sleep far longer (poll.Sleep, BenchmarkSleep)
	}
}

func writeHello(h Hello) error {
	j, err := json.Marshal(h)
	if err != nil {
		return err
	}
	_, err = os.Stdout.Write(append(append([]byte("\n"+helloPrefix), j...), '\n'))
	return err
}

// Peer is a running peer process.
type Peer struct {
	Hello
	cmd   *exec.Cmd
	stdin io.WriteCloser
}

// Start launches the peer (this test binary, re-executed) with a DRAM buffer of size bytes and the UCX
// backend params, loading NIXL from lib's folder; it is stopped by tb's cleanup. withDevice makes the peer
// run inside Main's device function.
func Start(tb testing.TB, lib *nixl.Library, size int64, ucxParams map[string]string, withDevice bool) *Peer {
	tb.Helper()
	return StartWith(tb, lib, size, ucxParams, Options{Device: withDevice})
}

// StartWith is Start with Options.
func StartWith(tb testing.TB, lib *nixl.Library, size int64, ucxParams map[string]string, o Options) *Peer {
	tb.Helper()
	pj, err := json.Marshal(ucxParams)
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	params := map[string]string{paramSize: strconv.FormatInt(size, 10), paramUCX: string(pj)}
	if o.Device {
		params[paramDevice] = "1"
	}
	if o.Pin {
		params[paramPin] = "1"
	}
	if o.Regions > 1 {
		params[paramRegions] = strconv.Itoa(o.Regions)
	}
	cmd := testenv.PeerCommand(context.Background(), Role, params)
	cmd.Env = append(cmd.Env, "NIXL_LIB_DIR="+lib.Dir(), "NIXL_PLUGIN_DIR="+lib.PluginDir())
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		tb.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	p := &Peer{cmd: cmd, stdin: stdin}
	tb.Cleanup(p.stop)
	line := make(chan error, 1)
	go func() {
		r := bufio.NewReaderSize(stdout, 1<<20)
		for {
			l, err := r.ReadBytes('\n')
			if err != nil {
				line <- fmt.Errorf("the benchmark peer exited without its hello: %w", err)
				break
			}
			// UCX's own output (stdio, buffered) may share the line: find the prefix anywhere in it.
			if i := bytes.Index(l, []byte(helloPrefix)); i >= 0 {
				line <- json.Unmarshal(l[i+len(helloPrefix):], &p.Hello)
				break
			}
		}
		_, _ = io.Copy(io.Discard, r) // keep draining: a peer blocked on a full pipe would stall the transfers
		_, _ = io.Copy(io.Discard, r)
	}()
	select {
	case err = <-line:
	case <-ctx.Done():
		err = fmt.Errorf("the benchmark peer did not start in time")
	}
	if err == nil && p.Error != "" {
		err = fmt.Errorf("benchmark peer: %s", p.Error)
	}
	if err != nil {
		tb.Fatal(err)
	}
	return p
}

func (p *Peer) stop() {
	_ = p.stdin.Close()
	done := make(chan error, 1)
	go func() { done <- p.cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		_ = p.cmd.Process.Kill()
		<-done
	}
}
