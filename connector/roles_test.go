package connector

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gonixl/gonixl/connector/protocol"
	"github.com/gonixl/gonixl/internal/testenv"
)

// The Go prefill role and the Go decode role move requests over real NIXL (UCX) and the real ZMQ side
// channel, for every profile: the bytes arrive, the notification frees P's blocks, the handshake is done once
// and cached, and both sides count what happened.
func TestRolesRoundTrip(t *testing.T) {
	for _, p := range roleProfiles() {
		t.Run(p.Name, func(t *testing.T) {
			plog, plogs := observed()
			dlog, dlogs := observed()
			pr := newPair(t, p, pairOpts{prefillLog: plog, decodeLog: dlog})
			ctx := testenv.Context(t, 20*time.Second)

			var total int64
			for i, tokens := range []int{1, 16, 17, 40} {
				id := fmt.Sprintf("req-%d", i)
				kv := pr.prefill(t, ctx, id, tokens, i+1)
				n := (tokens + tinyBlock - 1) / tinyBlock
				checkParams(t, p, pr.pre, kv, id, tokens, n)
				assert.Equal(t, 1, pr.pre.Held())

				local := localBlocks(n, 2*i)
				res, err := pr.dec.Pull(ctx, "dec-"+id, kv, local)
				require.NoError(t, err)
				requirePattern(t, pr.dcache, local, kv.RemoteBlockIDs[0], i+1)

				g := pr.dcache.Geometry()
				wantBytes := int64(n) * g.BlockLen() * int64(g.NumRegions())
				assert.Equal(t, wantBytes, res.Bytes)
				assert.Equal(t, n, res.Blocks)
				assert.Equal(t, "dec-"+id, res.RequestID)
				assert.Positive(t, res.Transfer)
				assert.Positive(t, res.GBps())
				if i == 0 {
					assert.Positive(t, res.Handshake, "the first pull does the handshake")
				} else {
					assert.Zero(t, res.Handshake, "later pulls reuse the cached handshake")
				}
				total += wantBytes
				// The notification the READ carried frees P's blocks.
				require.Eventually(t, func() bool { return pr.pre.Held() == 0 }, 30*time.Second, 5*time.Millisecond)
				assert.Zero(t, pr.pre.pool.InUse())
			}

			// Counters on both sides.
			assert.EqualValues(t, 4, pr.preM.Requests())
			assert.EqualValues(t, 4, pr.decM.Requests())
			assert.Equal(t, total, pr.preM.Bytes())
			assert.Equal(t, total, pr.decM.Bytes())
			assert.EqualValues(t, 1+1+2+3, pr.preM.BlocksFreed())
			assert.Zero(t, pr.preM.BlocksHeld())
			assert.Zero(t, pr.preM.BlocksExpired())
			assert.EqualValues(t, 4, pr.preM.Notifications())
			assert.Zero(t, pr.preM.BadMessages())
			assert.EqualValues(t, 1, pr.decM.Handshakes())
			assert.Zero(t, pr.decM.RequestErrors())
			ds, ps := gather(t, pr.decM), gather(t, pr.preM)
			assert.EqualValues(t, 1, ds["gonixl_handshake_time_seconds_count"])
			assert.Positive(t, ds["gonixl_handshake_time_seconds_sum"])
			assert.EqualValues(t, 4, ds["gonixl_xfer_time_seconds_count"])
			assert.EqualValues(t, 4, ps["gonixl_stage_time_seconds_count"])

			// Logs carry the engine ids and request ids.
			hs := dlogs.FilterMessage("handshake done").All()
			require.Len(t, hs, 1)
			assert.Equal(t, pr.pre.EngineID(), fieldsOf(hs[0])["remote_engine_id"])
			assert.Equal(t, pr.dec.EngineID(), fieldsOf(hs[0])["engine_id"])
			pulled := dlogs.FilterMessage("pulled").All()
			require.Len(t, pulled, 4)
			assert.Equal(t, "dec-req-3", fieldsOf(pulled[3])["request_id"])
			assert.Equal(t, "req-3", fieldsOf(pulled[3])["remote_request_id"])
			freed := plogs.FilterMessage("decode peer finished reading; blocks freed").All()
			require.Len(t, freed, 4)
			for _, e := range freed {
				assert.Equal(t, pr.pre.EngineID(), fieldsOf(e)["engine_id"])
				assert.Contains(t, fieldsOf(e)["request_id"], "req-")
			}
			held := plogs.FilterMessage("blocks held for decode").All()
			require.Len(t, held, 4)
			assert.Equal(t, "req-0", fieldsOf(held[0])["request_id"])
		})
	}
}

// checkParams checks P's kv_transfer_params against what the profile's vLLM prefill worker returns: the
// profile's keys in its order, round-tripping through the JSON codec, pointing at this worker.
func checkParams(t *testing.T, p protocol.Profile, pre *Prefill, kv protocol.KVTransferParams, id string, tokens, blocks int) {
	t.Helper()
	assert.True(t, kv.DoRemotePrefill)
	assert.False(t, kv.DoRemoteDecode)
	assert.Equal(t, id, LocalRequestID(kv.RemoteRequestID))
	assert.True(t, strings.HasPrefix(kv.RemoteRequestID, id+remoteIDSep), "the unguessable suffix")
	assert.Equal(t, pre.EngineID(), kv.RemoteEngineID)
	assert.Equal(t, "127.0.0.1", kv.RemoteHost)
	assert.Equal(t, pre.Port(), kv.RemotePort)
	assert.Equal(t, 1, kv.TPSize)
	require.Len(t, kv.RemoteBlockIDs, 1)
	assert.Len(t, kv.RemoteBlockIDs[0], blocks)
	seen := map[int64]bool{}
	for _, b := range kv.RemoteBlockIDs[0] {
		assert.Positive(t, b, "block 0 is vLLM's null block")
		assert.Less(t, b, int64(pre.reg.geom.NumBlocks))
		assert.False(t, seen[b], "duplicate block id %d", b)
		seen[b] = true
	}
	raw, err := p.EncodeParams(kv)
	require.NoError(t, err)
	// The keys, in order, are vLLM's.
	dec := json.NewDecoder(strings.NewReader(string(raw)))
	_, err = dec.Token()
	require.NoError(t, err)
	var keys []string
	for dec.More() {
		k, err := dec.Token()
		require.NoError(t, err)
		keys = append(keys, k.(string))
		var skip json.RawMessage
		require.NoError(t, dec.Decode(&skip))
	}
	assert.Equal(t, p.ParamsKeys, keys)
	back, err := p.DecodeParams(raw)
	require.NoError(t, err)
	require.NoError(t, back.ValidateForDecode())
	assert.Equal(t, kv.RemoteBlockIDs, back.RemoteBlockIDs)
	if p.BlockIDs == protocol.BlockIDsFlat {
		assert.Contains(t, string(raw), `"remote_block_ids": [`, "0.16 sends a flat list")
		assert.NotContains(t, string(raw), `"remote_block_ids": [[`)
	} else {
		assert.Contains(t, string(raw), `"remote_block_ids": [[`, "0.18+ sends one list per KV-cache group")
	}
	if slices.Contains(p.ParamsKeys, "remote_num_tokens") {
		assert.EqualValues(t, tokens, back.RemoteNumTokens)
	}
	if slices.Contains(p.ParamsKeys, "transfer_mode") {
		assert.Equal(t, "pull", back.TransferMode)
	}
}

// Several decode goroutines pull different requests from one prefill role at once; the handshake is done once
// (concurrent callers wait for it) and every byte arrives.
func TestRolesConcurrentPulls(t *testing.T) {
	p, _ := protocol.ProfileByName("0.33")
	pr := newPair(t, p, pairOpts{prefillBlocks: 64, decodeBlocks: 64})
	ctx := testenv.Context(t, 20*time.Second)
	const reqs = 8
	kvs := make([]protocol.KVTransferParams, reqs)
	for i := range kvs {
		kvs[i] = pr.prefill(t, ctx, fmt.Sprintf("c-%d", i), 3*tinyBlock, 10+i)
	}
	var wg sync.WaitGroup
	errs := make([]error, reqs)
	for i := range kvs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = pr.dec.Pull(ctx, fmt.Sprintf("d-%d", i), kvs[i], localBlocks(3, 3*i))
		}()
	}
	wg.Wait()
	for i, err := range errs {
		require.NoError(t, err, "pull %d", i)
		requirePattern(t, pr.dcache, localBlocks(3, 3*i), kvs[i].RemoteBlockIDs[0], 10+i)
	}
	assert.EqualValues(t, 1, pr.decM.Handshakes(), "one handshake for all concurrent pulls")
	require.Eventually(t, func() bool { return pr.pre.Held() == 0 }, 30*time.Second, 5*time.Millisecond)
	assert.EqualValues(t, 3*reqs, pr.preM.BlocksFreed())
	assert.Zero(t, pr.pre.pool.InUse())
}

// A prefill whose fill fails frees its blocks and publishes nothing; a pool that is too small says so.
func TestPrefillFailuresFreeBlocks(t *testing.T) {
	p, _ := protocol.ProfileByName("0.16")
	pr := newPair(t, p, pairOpts{prefillBlocks: 8})
	ctx := testenv.Context(t, 10*time.Second)
	boom := errors.New("device fault")
	_, err := pr.pre.Hold(ctx, "f1", 40, func(context.Context, []int) error { return boom })
	require.ErrorIs(t, err, boom)
	assert.Zero(t, pr.pre.pool.InUse())
	assert.Zero(t, pr.pre.Held())
	assert.EqualValues(t, 1, pr.preM.RequestErrors())
	assert.Zero(t, pr.preM.Requests())

	_, err = pr.pre.Hold(ctx, "big", 8*tinyBlock, nil) // 8 blocks, 7 usable (block 0 is null)
	require.ErrorIs(t, err, ErrNoBlocks)
	assert.NotErrorIs(t, err, ErrDuplicateRequest)
	assert.Zero(t, pr.pre.pool.InUse())

	_, err = pr.pre.Hold(ctx, "", 4, nil)
	require.Error(t, err)
	_, err = pr.pre.Hold(ctx, "zero", 0, nil)
	require.Error(t, err)

	_, err = pr.pre.Hold(ctx, "dup", 4, nil)
	require.NoError(t, err)
	_, err = pr.pre.Hold(ctx, "dup", 4, nil)
	require.ErrorIs(t, err, ErrDuplicateRequest)
	require.ErrorContains(t, err, "held for a decode peer")
	assert.NotErrorIs(t, err, ErrNoBlocks)
	assert.Equal(t, 1, pr.pre.pool.InUse())
	assert.True(t, pr.pre.Abort("dup"))
	assert.False(t, pr.pre.Abort("dup"))
	assert.Zero(t, pr.pre.pool.InUse())
	assert.Zero(t, pr.preM.BlocksHeld())
}

// Two prefills of the same request id that overlap must not leak the first one's blocks: exactly one is held,
// the other is refused, and the pool holds only the held request's blocks.
func TestPrefillDuplicateIDRace(t *testing.T) {
	p, _ := protocol.ProfileByName("0.16")
	pr := newPair(t, p, pairOpts{})
	ctx := testenv.Context(t, 10*time.Second)
	entered := make(chan struct{})
	release := make(chan struct{})
	var first error
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, first = pr.pre.Hold(ctx, "same", 2*tinyBlock, func(context.Context, []int) error {
			close(entered)
			<-release
			return nil
		})
	}()
	<-entered
	_, second := pr.pre.Hold(ctx, "same", 2*tinyBlock, nil)
	close(release)
	<-done
	assert.True(t, (first == nil) != (second == nil), "exactly one prefill of the id succeeds (first %v, second %v)", first, second)
	require.ErrorIs(t, errors.Join(first, second), ErrDuplicateRequest)
	assert.Equal(t, 1, pr.pre.Held())
	assert.Equal(t, 2, pr.pre.pool.InUse(), "the refused prefill's blocks are back in the pool")
	assert.EqualValues(t, 2, pr.preM.BlocksHeld())
	require.True(t, pr.pre.Abort("same"))
	assert.Zero(t, pr.pre.pool.InUse())
}

// Close gives the blocks still held for decode peers back to the allocator, after the cache is deregistered
// (no peer can read them any more), and is idempotent.
func TestPrefillCloseReleasesHeld(t *testing.T) {
	p, _ := protocol.ProfileByName("0.33")
	c := newCache(t, tinyGeom(t, p, 16))
	m := &Metrics{}
	pre, err := NewPrefill(PrefillConfig{RoleConfig: RoleConfig{Profile: p, Library: testLib(t), Cache: c, Compat: tinyCompat(p), Metrics: m}})
	require.NoError(t, err)
	ctx := testenv.Context(t, 10*time.Second)
	_, err = pre.Hold(ctx, "a", 3*tinyBlock, nil)
	require.NoError(t, err)
	_, err = pre.Hold(ctx, "b", tinyBlock, nil)
	require.NoError(t, err)
	assert.Equal(t, 4, pre.pool.InUse())
	require.NoError(t, pre.Close())
	assert.Zero(t, pre.pool.InUse())
	assert.Zero(t, pre.Held())
	assert.Zero(t, m.BlocksHeld())
	require.NoError(t, pre.Close())
	_, err = pre.Agent().LocalMetadata()
	require.Error(t, err, "the agent is closed")
}
