package connector

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/gonixl/gonixl/connector/blockhash"
	"github.com/gonixl/gonixl/connector/kvevents"
	"github.com/gonixl/gonixl/connector/protocol"
	"github.com/gonixl/gonixl/internal/poll"
	"github.com/gonixl/gonixl/internal/testenv"
	"github.com/gonixl/gonixl/internal/zmtp"
)

// eventSub is a Go ZMTP SUB peer of a prefill role's KV events.
type eventSub struct {
	c    *zmtp.Conn
	next uint64 // the sequence number expected next
}

func subscribeEvents(t *testing.T, ctx context.Context, pre *Prefill) *eventSub {
	t.Helper()
	var d net.Dialer
	nc, err := d.DialContext(ctx, "tcp", pre.KVEventsAddr().String())
	require.NoError(t, err)
	dl, _ := ctx.Deadline()
	require.NoError(t, nc.SetDeadline(dl))
	c, err := zmtp.Handshake(nc, zmtp.Options{Type: zmtp.SUB})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	require.NoError(t, c.WriteMessage([][]byte{zmtp.AppendSubscription(nil, zmtp.Subscription{Subscribe: true})}))
	b := poll.Backoff{Min: time.Millisecond, Max: 20 * time.Millisecond}
	require.NoError(t, b.Until(ctx, func() bool { return pre.prefix.pub.Stats().Matching == 1 }), "the subscription never matched")
	return &eventSub{c: c}
}

// recv reads the next batch and returns its events as msgspec encodes them for 0.26+ (maps).
func (s *eventSub) recv(t *testing.T) []map[string]any {
	t.Helper()
	msg, err := s.c.ReadMessage()
	require.NoError(t, err)
	require.Len(t, msg, 3)
	require.Equal(t, s.next, binary.BigEndian.Uint64(msg[1]), "sequence numbers without gaps")
	s.next++
	var batch []any
	d := msgpack.NewDecoder(bytes.NewReader(msg[2]))
	d.UseLooseInterfaceDecoding(true) // every integer as int64 or uint64
	require.NoError(t, d.Decode(&batch))
	require.Len(t, batch, 3) // [ts, events, data_parallel_rank]
	var out []map[string]any
	for _, e := range batch[1].([]any) {
		out = append(out, e.(map[string]any))
	}
	return out
}

// intHashes converts block hashes as vLLM publishes them by default (the low 64 bits).
func intHashes(hs []blockhash.Hash) []any {
	out := make([]any, len(hs))
	for i, h := range hs {
		out[i] = binary.BigEndian.Uint64(h[24:])
	}
	return out
}

// eventInts normalises the integers of a list decoded loosely (int64 or uint64) to uint64 for comparison.
func eventInts(v any) []any {
	var out []any
	for _, x := range v.([]any) {
		if n, ok := x.(int64); ok {
			x = uint64(n)
		}
		out = append(out, x)
	}
	return out
}

func tokenRange(from, n int) []int64 {
	out := make([]int64, n)
	for i := range out {
		out[i] = int64(from + i)
	}
	return out
}

// TestPrefixCacheReuse: with PrefillConfig.PrefixCache a request sharing a finished request's full blocks
// gets those blocks (not refilled, reported as remote_prefill_cached_tokens), the decode peer reads the
// right bytes from both, the cache evicts under pressure, and every change is published as vLLM's KV events,
// AllBlocksCleared at Close included.
func TestPrefixCacheReuse(t *testing.T) {
	p, err := protocol.ProfileFor("0.33.0")
	require.NoError(t, err)
	seed := "0"
	pr := newPair(t, p, pairOpts{prefillBlocks: 9, decodeBlocks: 16,
		prefixCache: &PrefixCacheConfig{PythonHashSeed: &seed}, kvEvents: &KVEventsConfig{}})
	ctx := testenv.Context(t, 60*time.Second)
	sub := subscribeEvents(t, ctx, pr.pre)
	hasher, err := blockhash.New(blockhash.Config{Release: blockhash.Releases[len(blockhash.Releases)-1], PythonHashSeed: &seed, BlockSize: tinyBlock})
	require.NoError(t, err)

	type filled struct {
		blocks []int
		from   int
	}
	// run holds a request of tokens whose newly written blocks get seed's pattern, pulls it and waits until
	// the prefill has freed it.
	run := func(id string, tokens []int64, seed int) (protocol.KVTransferParams, filled) {
		t.Helper()
		var f filled
		kv, err := pr.pre.HoldTokens(ctx, id, tokens, "", func(_ context.Context, blocks []int, from int) error {
			f = filled{append([]int(nil), blocks...), from}
			fillPattern(pr.pcache, blocks[from:], seed)
			return nil
		})
		require.NoError(t, err)
		n := len(kv.RemoteBlockIDs[0])
		_, err = pr.dec.Pull(ctx, id, kv, localBlocks(n, 0))
		require.NoError(t, err)
		require.NoError(t, poll.Backoff{Min: time.Millisecond, Max: 20 * time.Millisecond}.Until(ctx, func() bool { return pr.pre.Held() == 0 }))
		return kv, f
	}

	// A: three full blocks and a partial one; nothing cached yet.
	a := tokenRange(1000, 3*tinyBlock+5)
	kvA, fa := run("a", a, 1)
	require.Zero(t, fa.from)
	require.Zero(t, kvA.RemotePrefillCachedTokens)
	requirePattern(t, pr.dcache, localBlocks(4, 0), kvA.RemoteBlockIDs[0], 1)
	ha, err := hasher.Hashes(a, "")
	require.NoError(t, err)
	ev := sub.recv(t)
	require.Len(t, ev, 1)
	require.Equal(t, "BlockStored", ev[0]["type"])
	require.Equal(t, intHashes(ha), eventInts(ev[0]["block_hashes"]))
	require.Nil(t, ev[0]["parent_block_hash"])
	require.Equal(t, eventInts(anySlice(a[:3*tinyBlock])), eventInts(ev[0]["token_ids"]))
	require.EqualValues(t, tinyBlock, ev[0]["block_size"])
	require.Equal(t, "GPU", ev[0]["medium"])
	require.Equal(t, []any{nil, nil, nil}, ev[0]["extra_keys"])
	require.EqualValues(t, 3, pr.preM.PrefixCacheBlocks())

	// B shares A's first two blocks: they are reused, not written, and read back with A's bytes.
	b := append(append([]int64(nil), a[:2*tinyBlock]...), tokenRange(5000, tinyBlock+3)...)
	kvB, fb := run("b", b, 2)
	require.Equal(t, 2, fb.from, "the fill writes only the blocks after the cached prefix")
	require.EqualValues(t, 2*tinyBlock, kvB.RemotePrefillCachedTokens)
	require.Equal(t, kvA.RemoteBlockIDs[0][:2], kvB.RemoteBlockIDs[0][:2])
	requirePattern(t, pr.dcache, localBlocks(2, 0), kvB.RemoteBlockIDs[0][:2], 1)
	requirePattern(t, pr.dcache, localBlocks(2, 2), kvB.RemoteBlockIDs[0][2:], 2)
	hb, err := hasher.Hashes(b, "")
	require.NoError(t, err)
	ev = sub.recv(t)
	require.Len(t, ev, 1)
	require.Equal(t, intHashes(hb[2:]), eventInts(ev[0]["block_hashes"]), "only the new full block is stored")
	require.Equal(t, intHashes(hb[1:2])[0], eventInts([]any{ev[0]["parent_block_hash"]})[0])

	// A again, cut to exactly three blocks: vLLM leaves the last token to compute, so two blocks hit.
	kvC, fc := run("c", a[:3*tinyBlock], 3)
	require.Equal(t, 2, fc.from)
	require.EqualValues(t, 2*tinyBlock, kvC.RemotePrefillCachedTokens)
	require.Equal(t, kvA.RemoteBlockIDs[0][:2], kvC.RemoteBlockIDs[0][:2])
	// Its third block is A's hash, already cached: no event (the next one is the eviction below).

	// Pressure: a plain Hold of 8 blocks (the pool has 8) evicts every cached block, least recently used first.
	require.EqualValues(t, 4, pr.preM.PrefixCacheBlocks())
	kvD, err := pr.pre.Hold(ctx, "d", 8*tinyBlock, patternFill(pr.pcache, 4))
	require.NoError(t, err)
	ev = sub.recv(t)
	require.Len(t, ev, 1)
	require.Equal(t, "BlockRemoved", ev[0]["type"])
	require.ElementsMatch(t, intHashes([]blockhash.Hash{ha[0], ha[1], ha[2], hb[2]}), eventInts(ev[0]["block_hashes"]))
	require.EqualValues(t, 4, pr.preM.PrefixCacheEvictions())
	require.Zero(t, pr.preM.PrefixCacheBlocks())
	_, err = pr.dec.Pull(ctx, "d", kvD, localBlocks(8, 0))
	require.NoError(t, err)
	requirePattern(t, pr.dcache, localBlocks(8, 0), kvD.RemoteBlockIDs[0], 4)

	require.EqualValues(t, len(a)+len(b)+3*tinyBlock, pr.preM.PrefixCacheQueries())
	require.EqualValues(t, 4*tinyBlock, pr.preM.PrefixCacheHits())
	require.EqualValues(t, len(a)+(len(b)-2*tinyBlock)+tinyBlock, pr.preM.PrefixCacheMisses())
	require.EqualValues(t, 3, pr.preM.KVEventsPublished())
	require.Equal(t, 1, pr.preM.KVEventsSubscribers())

	// Close clears the cache and the last batch reaches the subscriber before the socket closes.
	require.NoError(t, pr.pre.Close())
	ev = sub.recv(t)
	require.Equal(t, []map[string]any{{"type": "AllBlocksCleared"}}, ev)
}

func anySlice(v []int64) []any {
	out := make([]any, len(v))
	for i, x := range v {
		out[i] = x
	}
	return out
}

// TestPrefixCacheConfig: what the prefix cache and events refuse, before anything is registered.
func TestPrefixCacheConfig(t *testing.T) {
	p, err := protocol.ProfileFor("0.33.0")
	require.NoError(t, err)
	l := testLib(t)
	for name, tc := range map[string]struct {
		pc   *PrefixCacheConfig
		ev   *KVEventsConfig
		want string
	}{
		"events without cache": {ev: &KVEventsConfig{}, want: "KVEvents needs PrefixCache"},
		"negative bound":       {pc: &PrefixCacheConfig{MaxBlocks: -1}, want: "MaxBlocks is -1"},
		"unknown format":       {pc: &PrefixCacheConfig{}, ev: &KVEventsConfig{Format: "0.99"}, want: "KVEventsConfig.Format"},
		"xxhash":               {pc: &PrefixCacheConfig{Algo: blockhash.XXHash}, want: "unsupported"},
	} {
		t.Run(name, func(t *testing.T) {
			c := newCache(t, tinyGeom(t, p, 8))
			pre, err := NewPrefill(PrefillConfig{RoleConfig: RoleConfig{Profile: p, Library: l, Cache: c, Compat: tinyCompat(p)},
				PrefixCache: tc.pc, KVEvents: tc.ev})
			if err == nil {
				_ = pre.Close()
			}
			require.ErrorContains(t, err, tc.want, fmt.Sprint(name))
		})
	}
}

// TestPrefixEventsVLLM: a vLLM subscriber (pyzmq's SUB and vLLM's own KVEventBatch decoder, from each release's
// venv) decodes every KV event a prefill role publishes (kvevents/testdata/kv_events_sub.py), and msgspec re-encodes
// each batch to the same bytes: stored blocks (fresh, after a cached prefix, under a cache_salt), removed
// blocks at eviction, and AllBlocksCleared at Close, in order, with vLLM's block hashes for the release.
func TestPrefixEventsVLLM(t *testing.T) {
	for _, venv := range testenv.OracleVenvs("0.16.0 0.33.0", "0.16.0 0.32.0") {
		t.Run(venv.Name, func(t *testing.T) {
			py := testenv.VenvPython(t, venv.Name, "the "+venv.Name+" venv", "run `make deps` (vllm-venvs, vllm-cpu-venvs)")
			p, err := protocol.ProfileFor(venv.Version)
			require.NoError(t, err)
			seed := "42"
			const topic, rank = "kv@gonixl", 3
			pr := newPair(t, p, pairOpts{prefillBlocks: 9, prefixCache: &PrefixCacheConfig{PythonHashSeed: &seed},
				kvEvents: &KVEventsConfig{Topic: topic, DataParallelRank: rank}})
			ctx := testenv.Context(t, 2*time.Minute)
			cmd := exec.CommandContext(ctx, py, filepath.Join("kvevents", "testdata", "kv_events_sub.py"),
				"--endpoint", "tcp://"+pr.pre.KVEventsAddr().String(), "--topic", topic)
			cmd.Env = append(os.Environ(), "VLLM_LOGGING_LEVEL=WARNING")
			c := testenv.StartChild(t, cmd, true)
			line, err := c.Stdout.ReadString('\n')
			require.NoError(t, err, "the subscriber did not start: %s", c.Stderr.Tail(4000))
			require.Equal(t, "ready", strings.TrimSpace(line))
			b := poll.Backoff{Min: time.Millisecond, Max: 20 * time.Millisecond}
			require.NoError(t, b.Until(ctx, func() bool { return pr.pre.prefix.pub.Stats().Matching == 1 }), "the subscriber never subscribed")

			rel, err := blockhash.ReleaseFor(venv.Version)
			require.NoError(t, err)
			hasher, err := blockhash.New(blockhash.Config{Release: rel, PythonHashSeed: &seed, BlockSize: tinyBlock})
			require.NoError(t, err)
			hold := func(id string, tokens []int64, salt string) {
				_, err := pr.pre.HoldTokens(ctx, id, tokens, salt, nil)
				require.NoError(t, err)
				require.True(t, pr.pre.Abort(id))
			}
			a := tokenRange(100, 3*tinyBlock+5)
			bt := append(append([]int64(nil), a[:2*tinyBlock]...), tokenRange(900, tinyBlock+3)...)
			ct := tokenRange(100, 2*tinyBlock+1) // A's tokens, under a cache_salt: other hashes
			hold("a", a, "")
			hold("b", bt, "")
			hold("c", ct, "salt-1")
			_, err = pr.pre.Hold(ctx, "d", 8*tinyBlock, nil) // evicts all 6 cached blocks
			require.NoError(t, err)
			require.True(t, pr.pre.Abort("d"))
			require.NoError(t, pr.pre.Close())

			_, err = fmt.Fprintf(c.Stdin, "expect 5\n")
			require.NoError(t, err)
			out, err := c.Stdout.ReadString('\n')
			require.NoError(t, err, "the subscriber failed: %s", c.Stderr.Tail(4000))
			var got []struct {
				Topic  string           `json:"topic"`
				Seq    uint64           `json:"seq"`
				Events []map[string]any `json:"events"`
				Rank   *int64           `json:"data_parallel_rank"`
			}
			require.NoError(t, json.Unmarshal([]byte(out), &got))
			require.Len(t, got, 5)
			ha, _ := hasher.Hashes(a, "")
			hb, _ := hasher.Hashes(bt, "")
			hc, _ := hasher.Hashes(ct, "salt-1")
			f, err := kvevents.FormatFor(venv.Version)
			require.NoError(t, err)
			num := func(hs ...blockhash.Hash) []any {
				out := make([]any, len(hs))
				for i, h := range hs {
					out[i] = float64(binary.BigEndian.Uint64(h[24:]))
				}
				return out
			}
			tokens := func(ts []int64) []any {
				out := make([]any, len(ts))
				for i, x := range ts {
					out[i] = float64(x)
				}
				return out
			}
			stored := func(hashes []any, parent any, ts []int64, extra []any) map[string]any {
				m := map[string]any{"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
					"token_ids": tokens(ts), "block_size": float64(tinyBlock), "medium": "GPU"}
				if f.StoredHas("extra_keys") {
					m["extra_keys"] = extra
				}
				if f.StoredHas("group_idx") {
					m["group_idx"] = float64(0)
				}
				return m
			}
			want := []map[string]any{
				stored(num(ha...), nil, a[:3*tinyBlock], []any{nil, nil, nil}),
				stored(num(hb[2]), num(hb[1])[0], bt[2*tinyBlock:3*tinyBlock], []any{nil}),
				stored(num(hc...), nil, ct[:2*tinyBlock], []any{[]any{"salt-1"}, nil}),
			}
			for i, w := range want {
				require.Equal(t, uint64(i), got[i].Seq)
				require.Equal(t, topic, got[i].Topic)
				require.NotNil(t, got[i].Rank)
				require.EqualValues(t, rank, *got[i].Rank)
				require.Len(t, got[i].Events, 1)
				for k, v := range w {
					require.Equal(t, v, got[i].Events[0][k], "batch %d, %s", i, k)
				}
			}
			require.Len(t, got[3].Events, 1)
			require.Equal(t, "BlockRemoved", got[3].Events[0]["type"])
			require.ElementsMatch(t, num(ha[0], ha[1], ha[2], hb[2], hc[0], hc[1]), got[3].Events[0]["block_hashes"])
			require.Len(t, got[4].Events, 1)
			require.Equal(t, "AllBlocksCleared", got[4].Events[0]["type"])
		})
	}
}

// TestPrefixCacheReregister: registering the cache again (its memory may have been reallocated) drops every
// cached block, publishes AllBlocksCleared, and the next request sharing the old prefix finds nothing cached.
func TestPrefixCacheReregister(t *testing.T) {
	p, err := protocol.ProfileFor("0.33.0")
	require.NoError(t, err)
	seed := "0"
	pr := newPair(t, p, pairOpts{prefillBlocks: 9, prefixCache: &PrefixCacheConfig{PythonHashSeed: &seed}, kvEvents: &KVEventsConfig{}})
	ctx := testenv.Context(t, 30*time.Second)
	sub := subscribeEvents(t, ctx, pr.pre)
	a := tokenRange(7, 2*tinyBlock+1)
	hold := func(id string) protocol.KVTransferParams {
		kv, err := pr.pre.HoldTokens(ctx, id, a, "", nil)
		require.NoError(t, err)
		require.True(t, pr.pre.Abort(id))
		return kv
	}
	hold("a")
	require.Equal(t, "BlockStored", sub.recv(t)[0]["type"])
	require.EqualValues(t, 2*tinyBlock, hold("a-again").RemotePrefillCachedTokens)
	gen, err := pr.pre.Reregister()
	require.NoError(t, err)
	require.EqualValues(t, 2, gen)
	require.Equal(t, []map[string]any{{"type": "AllBlocksCleared"}}, sub.recv(t))
	require.Zero(t, pr.preM.PrefixCacheBlocks())
	require.Zero(t, hold("a-after").RemotePrefillCachedTokens, "nothing cached survives a registration")
	require.Equal(t, "BlockStored", sub.recv(t)[0]["type"])
}
