package neurontest_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/gonixl/gonixl/neuron"
	"github.com/gonixl/gonixl/neuron/neurontest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestSourceEmbedded(t *testing.T) {
	src := string(neurontest.Source())
	for _, sym := range []string{"nrt_init", "nrt_tensor_read_batch", "fake_nrt_ctl", "FAKE_NRT_OLD_RUNTIME"} {
		assert.True(t, strings.Contains(src, sym), sym)
	}
}

func TestBuildErrors(t *testing.T) {
	_, err := neurontest.Build("")
	require.ErrorContains(t, err, "needs a folder")
	// A folder that cannot be created is reported, not ignored.
	f := filepath.Join(t.TempDir(), "file")
	require.NoError(t, os.WriteFile(f, nil, 0o644))
	_, err = neurontest.Build(filepath.Join(f, "sub"))
	require.Error(t, err)
	// No C compiler: the error says what to install.
	t.Setenv("CC", "")
	t.Setenv("PATH", t.TempDir())
	_, err = neurontest.Build(t.TempDir())
	require.ErrorContains(t, err, "install gcc or set CC")
}

func TestBuildLoads(t *testing.T) {
	for _, c := range []struct {
		name  string
		build func(string) (string, error)
		batch bool
	}{{"current", neurontest.Build, true}, {"old runtime", neurontest.BuildOldRuntime, false}} {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv("FAKE_NRT_NUM_CORES", "3")
			lib, err := c.build(t.TempDir())
			require.NoError(t, err)
			require.Equal(t, "libnrt.so.1", filepath.Base(lib))
			rt, err := neuron.Load(neuron.LoadOptions{Path: lib})
			require.NoError(t, err)
			defer rt.Close()
			assert.Equal(t, "gonixl fake libnrt", rt.Version().Detail)
			assert.Equal(t, c.batch, rt.HasBatch())
			n, err := rt.VisibleCores()
			require.NoError(t, err)
			assert.Equal(t, 3, n)
		})
	}
}

// A build whose context has ended stops and says so; nothing is left behind.
func TestBuildContextCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	dir := t.TempDir()
	_, err := neurontest.BuildContext(ctx, dir)
	require.ErrorIs(t, err, context.Canceled)
	_, statErr := os.Stat(filepath.Join(dir, "libnrt.so.1"))
	require.True(t, os.IsNotExist(statErr), "no library from a cancelled build")
}
