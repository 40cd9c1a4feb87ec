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
	"github.com/gonixl/gonixl/internal/testenv"
	"github.com/gonixl/gonixl/nixl"
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

// newHostBufferedDRAM is a host-buffered tiny 16-block cache with its "device" copy.
func newHostBufferedDRAM(t testing.TB, p protocol.Profile) *hostBufferedDRAM {
	hb := &hostBufferedDRAM{DRAMCache: newCache(t, tinyGeom(t, p, 16))}
	hb.device = make([]byte, len(hb.Bytes()))
	return hb
}

// tinyPrefill is a prefill role over a tiny 16-block DRAM cache, closed when the test ends.
func tinyPrefill(t testing.TB, p protocol.Profile, l *nixl.Library) (*Prefill, *DRAMCache) {
	t.Helper()
	pc := newCache(t, tinyGeom(t, p, 16))
	pre, err := NewPrefill(PrefillConfig{RoleConfig: RoleConfig{Profile: p, Library: l, Cache: pc, Compat: tinyCompat(p)}})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, pre.Close()) })
	return pre, pc
}

// tinyDecode is a decode role over cache c for tinyPrefill's peer, closed at the end of the test; m may be nil.
func tinyDecode(t testing.TB, p protocol.Profile, l *nixl.Library, c Cache, m *Metrics) *Decode {
	t.Helper()
	d, err := NewDecode(DecodeConfig{RoleConfig: RoleConfig{Profile: p, Library: l, Cache: c, Compat: tinyCompat(p), Metrics: m}})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, d.Close()) })
	return d
}

// A host-buffered decode cache gets exactly one CopyToDevice per pulled request, with the local block ids,
// after the READ; its time is reported; a failing copy fails the pull with the copy's error.
func TestPullHostBuffered(t *testing.T) {
	p, _ := protocol.ProfileByName("0.33")
	l := testLib(t)
	pre, pc := tinyPrefill(t, p, l)
	hb := newHostBufferedDRAM(t, p)
	m := &Metrics{}
	d := tinyDecode(t, p, l, hb, m)
	ctx := testenv.Context(t, 10*time.Second)

	kv, err := pre.Hold(ctx, "hb-1", 2*tinyBlock, patternFill(pc, 5))
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
	kv, err = pre.Hold(ctx, "hb-2", tinyBlock, nil)
	require.NoError(t, err)
	_, err = d.Pull(ctx, "hb-2", kv, []int{9})
	require.ErrorIs(t, err, boom)
	assert.Contains(t, err.Error(), "host → device copy")
	assert.EqualValues(t, 1, m.RequestErrors())
	assert.EqualValues(t, 1, m.Requests())
	assert.EqualValues(t, 1, gather(t, m)["gonixl_copy_time_seconds_count"], "the copy that succeeded is timed")
}

// hostBufferedPipe is hostBufferedDRAM with started (here: immediate) copies, so the role pulls in slices.
type hostBufferedPipe struct {
	*hostBufferedDRAM
	waits int
}

func (h *hostBufferedPipe) StartCopyToDevice(blockIDs []int) error {
	return h.CopyToDevice(context.Background(), blockIDs)
}

func (h *hostBufferedPipe) WaitCopies(ctx context.Context) error {
	h.mu.Lock()
	h.waits++
	h.mu.Unlock()
	return ctx.Err()
}

var _ HostBufferedPipeline = (*hostBufferedPipe)(nil)

// A pipelined host-buffered cache is read in slices, each slice's copy started after its READ (the "device"
// ends up with the bytes NIXL brought, which a copy started too early would miss), every block exactly once,
// in order; the prefill side is notified once (its blocks are released) and the copies are waited for once.
func TestPullHostBufferedSlices(t *testing.T) {
	p, _ := protocol.ProfileByName("0.33")
	l := testLib(t)
	pre, pc := tinyPrefill(t, p, l)
	hb := &hostBufferedPipe{hostBufferedDRAM: newHostBufferedDRAM(t, p)}
	m := &Metrics{}
	d := tinyDecode(t, p, l, hb, m)
	ctx := testenv.Context(t, 10*time.Second)

	kv, err := pre.Hold(ctx, "hbs-1", 10*tinyBlock, patternFill(pc, 7))
	require.NoError(t, err)
	local := []int{12, 3, 4, 5, 9, 1, 2, 14, 15, 6}
	res, err := d.Pull(ctx, "hbs-1", kv, local)
	require.NoError(t, err)
	assert.Equal(t, 10, res.Blocks)
	var got []int
	for _, c := range hb.calls {
		got = append(got, c...)
	}
	require.Equal(t, local, got)
	require.Len(t, hb.calls, 5, "10 blocks in slices of 2")
	require.Equal(t, 1, hb.waits)
	ms := gather(t, m)
	for _, phase := range []string{"prepare", "post", "wait", "copy"} {
		assert.EqualValues(t, 1, ms["gonixl_xfer_"+phase+"_time_seconds_count"]+ms["gonixl_"+phase+"_time_seconds_count"], phase)
	}
	assert.EqualValues(t, 1, ms["gonixl_notify_time_seconds_count"], "one notification round, apart from the slices' READs")
	g := hb.Geometry()
	for r := 0; r < g.NumRegions(); r++ {
		for j, b := range local {
			off := g.RegionOffset(r) + int64(b)*g.BlockLen()
			for i, v := range hb.device[off : off+g.BlockLen()] {
				require.Equal(t, patternByte(7, r, int(kv.RemoteBlockIDs[0][j]), i), v, "region %d block %d byte %d", r, b, i)
			}
		}
	}
	require.Eventually(t, func() bool { return pre.Held() == 0 }, 5*time.Second, 10*time.Millisecond, "the prefill side releases the request on the notification")
}
