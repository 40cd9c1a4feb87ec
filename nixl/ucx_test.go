package nixl_test

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gonixl/gonixl/internal/nixltest"
	"github.com/gonixl/gonixl/internal/testenv"
	"github.com/gonixl/gonixl/nixl"
)

func TestUCXOptionsParams(t *testing.T) {
	p, err := nixl.UCXOptions{}.Params()
	require.NoError(t, err)
	require.Empty(t, p, "the zero value leaves everything to NIXL")
	p, err = nixl.UCXOptions{Devices: []string{"mlx5_0", "mlx5_1"}, NumWorkers: 2, NumThreads: 4, SplitBatchSize: 128,
		ErrorHandling: nixl.UCXErrorsNone, Engine: map[string]string{"RMA_PPLN_ENABLE": "y", "UCX_TLS": "tcp"}}.Params()
	require.NoError(t, err)
	require.Equal(t, map[string]string{"device_list": "mlx5_0,mlx5_1", "num_workers": "2", "num_threads": "4",
		"split_batch_size": "128", "ucx_error_handling_mode": "none", "engine_config": "RMA_PPLN_ENABLE=y,TLS=tcp"}, p)
	for _, bad := range []nixl.UCXOptions{
		{NumThreads: -1}, {ErrorHandling: "loud"}, {Engine: map[string]string{"A": "1,B=2"}}, {Engine: map[string]string{"": "x"}},
		{Devices: []string{"a,b"}},
	} {
		_, err := bad.Params()
		require.ErrorIs(t, err, nixl.ErrInvalidParam, "%+v", bad)
	}
	d := nixl.DefaultUCXOptions()
	require.Equal(t, "y", d.Engine[nixl.UCXRMAPipeline])
	require.LessOrEqual(t, d.NumThreads, 16)
	require.GreaterOrEqual(t, d.NumThreads, 4, "a pool on every host: it makes a cma READ faster on 2 cores too")
	require.Equal(t, 4, d.SplitBatchSize)
	spec, err := d.Spec()
	require.NoError(t, err)
	require.Equal(t, "UCX", spec.Plugin)
}

// TestUCXOptionsTransfer runs a READ of many descriptors through agents made with explicit options: the
// thread-pool engine splitting the request, no peer error handling, the RMA pipeline; NIXL accepts each.
func TestUCXOptionsTransfer(t *testing.T) {
	l := nixltest.Lib(t)
	for i, o := range []nixl.UCXOptions{
		nixl.DefaultUCXOptions(),
		{NumThreads: 2, SplitBatchSize: 8, Engine: map[string]string{nixl.UCXRMAPipeline: "y"}},
		{ErrorHandling: nixl.UCXErrorsNone, NumWorkers: 2},
	} {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			spec, err := o.Spec()
			require.NoError(t, err)
			mk := func(n string) *nixl.Agent {
				a, err := l.NewAgent(fmt.Sprintf("%s-%d-%d", n, i, os.Getpid()), nixl.AgentConfig{Backends: []nixl.BackendSpec{spec}})
				require.NoError(t, err)
				t.Cleanup(func() { a.Close() })
				return a
			}
			a, b := mk("ucxopt-a"), mk("ucxopt-b")
			const blk, n = 4096, 64
			ma, mb := hostMem(t, blk*n), hostMem(t, blk*n)
			for j := range mb.Bytes() {
				mb.Bytes()[j] = byte(j*13 + i)
			}
			connectDRAM(t, a, b, ma, mb)
			var ld, rd []nixl.Desc
			for j := range n {
				k := (j * 37) % n // scattered
				ld = append(ld, nixl.Desc{Addr: ma.Addr() + uint64(k*blk), Len: blk})
				rd = append(rd, nixl.Desc{Addr: mb.Addr() + uint64(k*blk), Len: blk})
			}
			x, err := a.CreateXfer(nixl.Read, nixl.DRAM, ld, nixl.DRAM, rd, b.Name())
			require.NoError(t, err)
			defer x.Close()
			postWait(t, testenv.Context(t, 30*time.Second), x)
			require.Equal(t, mb.Bytes(), ma.Bytes())
		})
	}
}
