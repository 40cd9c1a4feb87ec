package connector

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gonixl/gonixl/connector/protocol"
)

// hostBufferedDRAM is a decode cache with kv_buffer_device="cpu" semantics: NIXL fills the DRAM arena and the
// role must copy each pulled request's blocks to the "device", here a second host buffer (the cuda package's
// HostBufferedKVCache does the same into VRAM and is tested on the GPU machine).
type hostBufferedDRAM struct {
	*DRAMCache
	mu     sync.Mutex
	device []byte
	calls  [][]int
	fail   error
}

func (h *hostBufferedDRAM) CopyToDevice(ctx context.Context, blockIDs []int) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.calls = append(h.calls, append([]int(nil), blockIDs...))
	if h.fail != nil {
		return h.fail
	}
	g := h.Geometry()
	bl := g.BlockLen()
	for r := 0; r < g.NumRegions(); r++ {
		for _, b := range blockIDs {
			off := g.RegionOffset(r) + int64(b)*bl
			copy(h.device[off:off+bl], h.Bytes()[off:off+bl])
		}
	}
	return nil
}

var _ HostBuffered = (*hostBufferedDRAM)(nil)

// A host-buffered decode cache gets exactly one CopyToDevice per pulled request, with the local block ids,
// after the READ; its time is reported; a failing copy fails the pull with the copy's error.
func TestPullHostBuffered(t *testing.T) {
	p, _ := protocol.ProfileByName("0.33")
	l := testLib(t)
	pc := newCache(t, tinyGeom(t, p, 16))
	pre, err := NewPrefill(PrefillConfig{Profile: p, Library: l, Cache: pc, Compat: tinyCompat(p)})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, pre.Close()) })
	hb := &hostBufferedDRAM{DRAMCache: newCache(t, tinyGeom(t, p, 16))}
	hb.device = make([]byte, len(hb.Bytes()))
	m := &Metrics{}
	d, err := NewDecode(DecodeConfig{Profile: p, Library: l, Cache: hb, Compat: tinyCompat(p), Metrics: m})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, d.Close()) })
	ctx := ctxT(t, 10*time.Second)

	kv, err := pre.Prefill(ctx, "hb-1", 2*tinyBlock, patternFill(pc, 5))
	require.NoError(t, err)
	local := []int{7, 3}
	res, err := d.Pull(ctx, "hb-1", kv, local)
	require.NoError(t, err)
	assert.Positive(t, res.Copy)
	require.Equal(t, [][]int{local}, hb.calls)
	// The "device" holds the bytes NIXL put in host memory.
	g := hb.Geometry()
	for r := 0; r < g.NumRegions(); r++ {
		for j, b := range local {
			off := g.RegionOffset(r) + int64(b)*g.BlockLen()
			dev := hb.device[off : off+g.BlockLen()]
			for i, v := range dev {
				require.Equal(t, patternByte(5, r, int(kv.RemoteBlockIDs[0][j]), i), v, "region %d block %d byte %d", r, b, i)
			}
		}
	}

	boom := errors.New("device copy failed")
	hb.fail = boom
	kv, err = pre.Prefill(ctx, "hb-2", tinyBlock, nil)
	require.NoError(t, err)
	_, err = d.Pull(ctx, "hb-2", kv, []int{9})
	require.ErrorIs(t, err, boom)
	assert.Contains(t, err.Error(), "host → device copy")
	assert.EqualValues(t, 1, m.RequestErrors.Load())
	assert.EqualValues(t, 1, m.Requests.Load())
}
