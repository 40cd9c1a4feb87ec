package cuda_test

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/gonixl/gonixl/cuda"
	"github.com/gonixl/gonixl/internal/benchpeer"
	"github.com/gonixl/gonixl/internal/testenv"
)

// runner closes the package's shared device after the tests, before goleak looks.
type runner struct{ m *testing.M }

func (r runner) Run() int {
	code := r.m.Run()
	if shared.dev != nil {
		if err := shared.dev.Close(); err != nil {
			fmt.Fprintln(os.Stderr, "closing the shared device:", err)
			code = 1
		}
	}
	return code
}

func TestMain(m *testing.M) {
	benchpeer.PinHost = peerPin
	// Peers: BenchmarkDRAMToVRAM's DRAM peer process; TestErrorPaths' copy from a bad pointer, in a child process
	// in case it leaves the CUDA context unusable.
	testenv.ServePeer(testenv.Peers{benchpeer.Role: benchpeer.Main(peerDevice), "badptr": badPointerChild})
	goleak.VerifyTestMain(runner{m})
}

// requireGPU makes GPU tests fail instead of skip (set on the GPU machine, where a skip would hide a
// broken setup). CI never has a GPU, so there the GPU tests skip, also under CI=true.
const requireGPU = "GONIXL_REQUIRE_GPU"

var shared struct {
	once sync.Once
	drv  *cuda.Driver
	dev  *cuda.Device
	skip string
	err  error
}

// gpu returns device 0, opened once for the package, or skips the test saying why there is none.
func gpu(tb testing.TB) *cuda.Device {
	tb.Helper()
	shared.once.Do(func() {
		drv, err := cuda.Load(cuda.LoadOptions{})
		switch {
		case errors.Is(err, cuda.ErrNotLoaded):
			shared.skip = "no CUDA driver: " + err.Error()
			return
		case errors.Is(err, cuda.ErrNoDevice):
			shared.skip = "no CUDA device: " + err.Error()
			return
		case err != nil:
			shared.err = err
			return
		}
		shared.drv = drv
		n, err := drv.DeviceCount()
		if err != nil {
			shared.err = err
			return
		}
		if n == 0 {
			shared.skip = "no CUDA device: the driver reports 0 devices"
			return
		}
		shared.dev, shared.err = drv.Open(0)
	})
	if shared.skip != "" {
		if os.Getenv(requireGPU) != "" {
			tb.Fatalf("%s is set but: %s", requireGPU, shared.skip)
		}
		tb.Skip(shared.skip)
	}
	require.NoError(tb, shared.err)
	return shared.dev
}

// newStream is a new stream on dev, closed when the test ends.
func newStream(tb testing.TB, dev *cuda.Device) *cuda.Stream {
	tb.Helper()
	s, err := dev.NewStream()
	require.NoError(tb, err)
	tb.Cleanup(func() { _ = s.Close() })
	return s
}

// newEvent is a new event on dev (timing: Elapsed works on it), closed when the test ends.
func newEvent(tb testing.TB, dev *cuda.Device, timing bool) *cuda.Event {
	tb.Helper()
	e, err := dev.NewEvent(timing)
	require.NoError(tb, err)
	tb.Cleanup(func() { _ = e.Close() })
	return e
}

// peerDevice runs a benchmark peer with GPU 0's primary context bound to its OS thread.
func peerDevice(run func() error) error {
	drv, err := cuda.Load(cuda.LoadOptions{})
	if err != nil {
		return err
	}
	dev, err := drv.Open(0)
	if err != nil {
		return err
	}
	defer dev.Close()
	peerDev = dev
	return dev.Do(run)
}

// peerDev is the benchmark peer's device (set by peerDevice).
var peerDev *cuda.Device

// peerPin page-locks the benchmark peer's DRAM for CUDA, as a prefill worker holding a context can.
func peerPin(addr uintptr, size uint64) (func() error, error) {
	if peerDev == nil {
		return nil, errors.New("the peer pins its DRAM only inside its device context")
	}
	hr, err := peerDev.RegisterHost(addr, size)
	if err != nil {
		return nil, err
	}
	return hr.Close, nil
}
