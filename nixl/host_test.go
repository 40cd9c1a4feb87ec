package nixl_test

import (
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gonixl/gonixl/nixl"
)

// HugePages without reserved huge pages gives the memory to transparent huge pages: 2 MiB-aligned, every byte
// zero and writable, the size asked for, and unmapped by Close; without HugePages the memory is neither.
func TestAllocHostHugePages(t *testing.T) {
	thpOff := false
	if b, err := os.ReadFile("/sys/kernel/mm/transparent_hugepage/enabled"); err != nil || strings.Contains(string(b), "[never]") {
		thpOff = true
	}
	for _, size := range []int64{4096, 2<<20 + 12345, 8 << 20} {
		for _, lock := range []bool{false, true} {
			m, err := nixl.AllocHost(size, nixl.HostOptions{HugePages: true, Lock: lock})
			if lock && err != nil && errors.Is(err, nixl.ErrBackend) {
				t.Logf("mlock refused here: %v", err)
				continue
			}
			require.NoError(t, err)
			require.EqualValues(t, size, m.Len())
			if !m.HugePages() && !thpOff {
				require.True(t, m.TransparentHugePages(), "size %d: transparent huge pages when none are reserved", size)
			}
			if m.TransparentHugePages() {
				require.Zero(t, m.Addr()%(2<<20), "2 MiB-aligned")
			}
			b := m.Bytes()
			for i := 0; i < len(b); i += 4093 {
				require.Zero(t, b[i])
			}
			b[0], b[len(b)-1] = 1, 2
			require.NoError(t, m.Close())
			require.NoError(t, m.Close(), "idempotent")
			require.Nil(t, m.Bytes())
		}
	}
	m, err := nixl.AllocHost(2<<20, nixl.HostOptions{})
	require.NoError(t, err)
	require.False(t, m.HugePages())
	require.False(t, m.TransparentHugePages())
	require.NoError(t, m.Close())
}
