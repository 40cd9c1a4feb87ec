package demo

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/gonixl/gonixl/cuda"
)

// -cuda-context without a CUDA driver: auto (the default) and off are no-ops, on says what is missing, and a
// bad value is refused. The driver is looked for only where there is none, so this holds on a GPU host too.
func TestCUDAContextWithoutDriver(t *testing.T) {
	none := cuda.LoadOptions{Path: t.TempDir() + "/libcuda.so.1", NoSearch: true}
	for _, mode := range []string{"", CUDAContextAuto, CUDAContextOff} {
		dev, err := openCUDAContext(mode, none, zap.NewNop())
		require.NoError(t, err, "mode %q", mode)
		assert.Nil(t, dev, "mode %q", mode)
	}
	dev, err := openCUDAContext(CUDAContextOn, none, zap.NewNop())
	require.ErrorIs(t, err, cuda.ErrNotLoaded)
	assert.Nil(t, dev)
	assert.Contains(t, err.Error(), "-cuda-context on")
	_, err = openCUDAContext("yes", none, zap.NewNop())
	require.Error(t, err)
	assert.Contains(t, err.Error(), "want auto, on or off")
}
