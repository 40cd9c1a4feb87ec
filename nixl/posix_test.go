package nixl_test

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gonixl/gonixl/internal/nixltest"
	"github.com/gonixl/gonixl/internal/testenv"
	"github.com/gonixl/gonixl/nixl"
)

// TestFileMemoryWithPOSIX registers a FILE (descriptor metadata = its path, DevID = its fd) with the POSIX
// backend, asks QueryMem about it, and WRITEs and READs it from DRAM through the agent itself.
func TestFileMemoryWithPOSIX(t *testing.T) {
	l := nixltest.Lib(t)
	a, err := l.NewAgent("posix-"+t.Name(), nixl.AgentConfig{})
	require.NoError(t, err)
	defer a.Close()
	posix, err := a.CreateBackend("POSIX", nil)
	require.NoError(t, err)
	mems, _, err := posix.Params()
	require.NoError(t, err)
	require.Contains(t, mems, nixl.File)

	const size = 1 << 16
	path := filepath.Join(t.TempDir(), "kv.bin")
	f, err := os.Create(path)
	require.NoError(t, err)
	defer f.Close()
	require.NoError(t, f.Truncate(size))

	// QueryMem: the existing file is reported, a missing one is not.
	res, err := a.QueryMem(nixl.File, []nixl.RegDesc{
		{Desc: nixl.Desc{Len: size}, Meta: []byte(path)},
		{Desc: nixl.Desc{Len: size}, Meta: []byte(path + ".missing")},
	}, nixl.WithBackends(posix))
	require.NoError(t, err)
	require.Len(t, res, 2)
	require.NotNil(t, res[0], "the existing file should be reported")
	require.Nil(t, res[1], "a missing file has no answer")

	fileDesc := nixl.Desc{Addr: 0, Len: size, DevID: uint64(f.Fd())}
	freg, err := a.RegisterMemMeta(nixl.File, []nixl.RegDesc{{Desc: fileDesc, Meta: []byte(path)}}, nixl.WithBackends(posix))
	require.NoError(t, err)
	defer freg.Close()
	m := hostMem(t, size)
	mreg, err := a.RegisterMem(nixl.DRAM, []nixl.Desc{m.Desc()}, nixl.WithBackends(posix))
	require.NoError(t, err)
	defer mreg.Close()

	fill(m.Bytes(), 77)
	w, err := a.CreateXfer(nixl.Write, nixl.DRAM, []nixl.Desc{m.Desc()}, nixl.File, []nixl.Desc{fileDesc}, a.Name(), nixl.WithBackends(posix))
	require.NoError(t, err)
	defer w.Close()
	postWait(t, testenv.Context(t, 30*time.Second), w)
	onDisk, err := os.ReadFile(path)
	require.NoError(t, err)
	require.True(t, bytes.Equal(onDisk, m.Bytes()), "the file does not hold what was written")

	clear(m.Bytes())
	r, err := a.CreateXfer(nixl.Read, nixl.DRAM, []nixl.Desc{m.Desc()}, nixl.File, []nixl.Desc{fileDesc}, a.Name(), nixl.WithBackends(posix))
	require.NoError(t, err)
	defer r.Close()
	postWait(t, testenv.Context(t, 30*time.Second), r)
	require.True(t, bytes.Equal(onDisk, m.Bytes()), "READ from the file moved the wrong bytes")
}
