package connector

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gonixl/gonixl/connector/protocol"
	"github.com/gonixl/gonixl/layout"
	"github.com/gonixl/gonixl/nixl"
)

// A role without a profile is refused before anything is registered, with the config field to set.
func TestRolesNeedAProfile(t *testing.T) {
	_, err := NewPrefill(PrefillConfig{})
	require.ErrorContains(t, err, "connector: PrefillConfig.Profile is not set")
	_, err = NewDecode(DecodeConfig{})
	require.ErrorContains(t, err, "connector: DecodeConfig.Profile is not set")
}

// A negative HoldTimeout would free every request's blocks at the first expiry pass, before a decode peer could
// read them: NewPrefill refuses it before it creates a cache or touches NIXL (no Library here), naming the field.
func TestPrefillRefusesNegativeHoldTimeout(t *testing.T) {
	qwen := Model{Name: "Qwen/Qwen3-0.6B", Layers: 28, KVHeads: 8, HeadDim: 128, DType: layout.BF16}
	for _, hold := range []time.Duration{-1, -time.Second} {
		_, err := NewPrefill(PrefillConfig{RoleConfig: RoleConfig{VLLMVersion: "0.16.0", Model: qwen, NumBlocks: 16}, HoldTimeout: hold})
		require.ErrorContains(t, err, "connector: PrefillConfig.HoldTimeout is "+hold.String()+": set a positive duration")
	}
	// So is a negative BusyPoll (0 is the default: polling back to back while blocks are held).
	_, err := NewPrefill(PrefillConfig{RoleConfig: RoleConfig{VLLMVersion: "0.16.0", Model: qwen, NumBlocks: 16}, BusyPoll: -time.Microsecond})
	require.ErrorContains(t, err, "connector: PrefillConfig.BusyPoll is -1µs: set 0 to poll back to back")
	// The same config with the default hold gets past the check (and fails only for want of a NIXL library).
	_, err = NewPrefill(PrefillConfig{RoleConfig: RoleConfig{VLLMVersion: "0.16.0", Model: qwen, NumBlocks: 16}})
	require.ErrorContains(t, err, "nil NIXL library")
	// A notification key too short to be secret, and ranks in separate processes without a shared key (each
	// would draw its own, and drop the others' notifications as forged), are refused naming the field.
	_, err = NewPrefill(PrefillConfig{RoleConfig: RoleConfig{VLLMVersion: "0.16.0", Model: qwen, NumBlocks: 16}, NotifyKey: []byte("short")})
	require.ErrorContains(t, err, "connector: PrefillConfig.NotifyKey has 5 bytes: give at least 16")
	_, err = NewPrefill(PrefillConfig{RoleConfig: RoleConfig{VLLMVersion: "0.16.0", Model: qwen, NumBlocks: 16, TPSize: 2}})
	require.ErrorContains(t, err, "connector: PrefillConfig.TPSize is 2 with no shared SideChannel: set NotifyKey")
	_, err = NewPrefill(PrefillConfig{RoleConfig: RoleConfig{VLLMVersion: "0.16.0", Model: qwen, NumBlocks: 16, TPSize: 2}, NotifyKey: make([]byte, 16)})
	require.ErrorContains(t, err, "nil NIXL library")
	// Likewise a decode role's HandshakeTimeout: a negative one would fail every handshake at once.
	_, err = NewDecode(DecodeConfig{RoleConfig: RoleConfig{VLLMVersion: "0.16.0", Model: qwen, NumBlocks: 16}, HandshakeTimeout: -time.Second})
	require.ErrorContains(t, err, "connector: DecodeConfig.HandshakeTimeout is -1s: set a positive duration")
	_, err = NewDecode(DecodeConfig{RoleConfig: RoleConfig{VLLMVersion: "0.16.0", Model: qwen, NumBlocks: 16}})
	require.ErrorContains(t, err, "nil NIXL library")
}

// What one role's field would silently not do is refused, naming the field: SkipCheck on a prefill role
// (it checks no hash), a negative handshake attempt count.
func TestRoleConfigRefusals(t *testing.T) {
	qwen := Model{Name: "Qwen/Qwen3-0.6B", Layers: 28, KVHeads: 8, HeadDim: 128, DType: layout.BF16}
	_, err := NewPrefill(PrefillConfig{RoleConfig: RoleConfig{VLLMVersion: "0.16.0", Model: qwen, NumBlocks: 16, Compat: Compat{SkipCheck: true}}})
	require.ErrorContains(t, err, "connector: PrefillConfig.Compat.SkipCheck is set")
	_, err = NewDecode(DecodeConfig{RoleConfig: RoleConfig{VLLMVersion: "0.16.0", Model: qwen, NumBlocks: 16}, HandshakeAttempts: -1})
	require.ErrorContains(t, err, "connector: DecodeConfig.HandshakeAttempts is -1")
	// The decode side's opt-out is taken (and fails only for want of a NIXL library).
	_, err = NewDecode(DecodeConfig{RoleConfig: RoleConfig{VLLMVersion: "0.16.0", Model: qwen, NumBlocks: 16, Compat: Compat{SkipCheck: true}}})
	require.ErrorContains(t, err, "nil NIXL library")
}

type deviceCache struct {
	fakeCache
	calls *int
}

func (c deviceCache) Do(fn func() error) error { *c.calls++; return fn() }

// RoleConfig.DeviceContext defaults to the cache's own (a cache that is a DeviceContext, like a cuda.KVCache),
// for either role; one given explicitly wins. The capabilities are looked up once, in resolve.
func TestRoleConfigDeviceContext(t *testing.T) {
	p16, _ := protocol.ProfileByName("0.16")
	g, err := geomFor(p16, 4)
	require.NoError(t, err)
	var calls int
	dc := deviceCache{fakeCache{g}, &calls}
	for _, r := range []role{rolePrefill, roleDecode} {
		c := RoleConfig{Profile: p16, Cache: dc}
		s, err := c.resolve(r)
		require.NoError(t, err)
		assert.Equal(t, DeviceContext(dc), c.DeviceContext, r)
		assert.Equal(t, DeviceContext(dc), s.caps.device, r)
		assert.Nil(t, s.caps.registrar)
		assert.Nil(t, s.caps.hostBuf)
		mine := deviceCache{fakeCache{g}, new(int)}
		c = RoleConfig{Profile: p16, Cache: dc, DeviceContext: mine}
		_, err = c.resolve(r)
		require.NoError(t, err)
		assert.Equal(t, DeviceContext(mine), c.DeviceContext, r)
	}
	c := RoleConfig{Profile: p16, Cache: fakeCache{g}}
	_, err = c.resolve(roleDecode)
	require.NoError(t, err)
	assert.Nil(t, c.DeviceContext, "a plain cache has none")
	reg := &registered{device: dc}
	require.NoError(t, reg.do(func() error { return nil }))
	assert.Equal(t, 1, calls, "NIXL calls run through the resolved context")
}

// DecodeConfig.ReadSpin: zero spins DefaultReadSpin into GPU memory and not at all into DRAM; negative never.
func TestReadSpinResolved(t *testing.T) {
	require.Equal(t, DefaultReadSpin, readSpin(0, nixl.VRAM))
	require.Zero(t, readSpin(0, nixl.DRAM))
	require.Zero(t, readSpin(-time.Nanosecond, nixl.VRAM))
	require.Equal(t, 3*time.Millisecond, readSpin(3*time.Millisecond, nixl.DRAM))
}
