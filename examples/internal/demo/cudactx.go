package demo

import (
	"errors"
	"fmt"
	"os"

	"go.uber.org/zap"

	"github.com/gonixl/gonixl/cuda"
	"github.com/gonixl/gonixl/neuron"
)

// CUDA context modes of the prefill worker (-cuda-context).
const (
	CUDAContextAuto = "auto" // hold one when a CUDA driver and a device are present
	CUDAContextOn   = "on"   // hold one; fail without a driver or device
	CUDAContextOff  = "off"  // never touch CUDA
)

// openCUDAContext retains GPU 0's primary context for the prefill worker according to mode ("" = auto), or
// returns nil when mode is off, or auto and no CUDA driver or device is present (a CPU host: a no-op).
//
// Why a prefill worker whose KV cache is host memory wants one: when the decode worker's cache is GPU memory
// on the same host, UCX serves its READ by a rendezvous through cuda_copy / cuda_ipc that the target side
// (this worker) runs in its progress calls, and that needs a current CUDA context there; without one UCX
// falls back to a software emulation over TCP (the demo's -prefill-cuda-context off;
// docs/measured.md). Across hosts an RDMA NIC reads host memory without any.
func openCUDAContext(mode string, opts cuda.LoadOptions, log *zap.Logger) (*cuda.Device, error) {
	switch mode {
	case CUDAContextOff:
		return nil, nil
	case "", CUDAContextAuto, CUDAContextOn:
	default:
		return nil, fmt.Errorf("-cuda-context %q: want auto, on or off", mode)
	}
	on := mode == CUDAContextOn
	drv, err := cuda.Load(opts)
	if err != nil {
		if !on && errors.Is(err, cuda.ErrNotLoaded) {
			log.Debug("no CUDA driver: the prefill worker holds no CUDA context", zap.Error(err))
			return nil, nil
		}
		return nil, fmt.Errorf("-cuda-context %s: %w", mode, err)
	}
	n, err := drv.DeviceCount()
	if err == nil && n == 0 {
		err = cuda.ErrNoDevice
	}
	if err != nil {
		if !on && (errors.Is(err, cuda.ErrNoDevice) || n == 0) {
			log.Debug("no CUDA device: the prefill worker holds no CUDA context", zap.Error(err))
			return nil, nil
		}
		return nil, fmt.Errorf("-cuda-context %s: %w", mode, err)
	}
	dev, err := drv.Open(0)
	if err != nil {
		return nil, fmt.Errorf("-cuda-context %s: %w", mode, err)
	}
	log.Info("prefill worker holds GPU 0's primary CUDA context (UCX serves reads into a GPU on this host through cuda_copy / cuda_ipc)",
		zap.String("gpu", dev.Props().Name))
	return dev, nil
}

// pinArena page-locks the staging arena for CUDA (cuMemHostRegister), so that UCX's cuda_copy reads it at
// pinned-memory speed. The arena is one page-aligned mapping; its regions lie inside it.
func pinArena(dev *cuda.Device, s *neuron.Stager) (*cuda.HostRegistration, error) {
	bases := s.RegionBases()
	if len(bases) == 0 {
		return nil, nil
	}
	lo, hi := bases[0], bases[0]
	for _, b := range bases {
		lo, hi = min(lo, b), max(hi, b)
	}
	hi += uint64(s.Geometry().RegionLen())
	page := uint64(os.Getpagesize())
	lo &^= page - 1
	hi = (hi + page - 1) &^ (page - 1)
	return dev.RegisterHost(uintptr(lo), hi-lo)
}
