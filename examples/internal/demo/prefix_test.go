package demo

import (
	"flag"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gonixl/gonixl/connector"
	"github.com/gonixl/gonixl/internal/nixltest"
	"github.com/gonixl/gonixl/internal/testenv"
	"github.com/gonixl/gonixl/layout"
)

// A prefill worker with a prefix cache reuses the cached leading blocks of a prompt that shares a prefix with
// an earlier one: it computes and stages only the other blocks (cached_tokens, staged_blocks), and the decode
// still verifies every byte of every block, the reused ones included. An unrelated prompt reuses nothing.
// GET /version reports the block size, the cache and the KV-event socket's bound address.
func TestPrefillPrefixCache(t *testing.T) {
	l := nixltest.Lib(t)
	ctx := testenv.Context(t, 3*time.Minute)
	pre, err := NewPrefillServer(ctx, PrefillConfig{VLLMVersion: "0.31.0", Model: Qwen3_0_6B, NumBlocks: 32, BatchRows: 2, MaxSeq: 128,
		Order: layout.HND, HoldTimeout: 10 * time.Minute, Library: l, CUDAContext: "off",
		PrefixCache: &connector.PrefixCacheConfig{MaxBlocks: 16}, KVEvents: &connector.KVEventsConfig{Addr: "127.0.0.1:0"}})
	require.NoError(t, err)
	defer pre.Close()
	dec, err := NewDecodeServer(DecodeConfig{VLLMVersion: "0.31.0", Model: Qwen3_0_6B, NumBlocks: 32, Order: layout.HND, Library: l})
	require.NoError(t, err)
	defer dec.Close()
	url := func(h http.Handler) string {
		srv := httptest.NewServer(h)
		t.Cleanup(srv.Close)
		return srv.URL
	}
	proxy := &Proxy{Prefill: url(pre.Handler()), Decode: url(dec.Handler())}

	info := pre.VersionInfo()
	assert.Equal(t, "0.31.0", info.Version)
	assert.Equal(t, 16, info.BlockSize)
	assert.Equal(t, 16, info.PrefixCacheBlocks)
	require.NotNil(t, info.KVEvents)
	host, port, err := net.SplitHostPort(strings.TrimPrefix(info.KVEvents.Endpoint, "tcp://"))
	require.NoError(t, err, info.KVEvents.Endpoint)
	assert.Equal(t, "127.0.0.1", host)
	assert.NotEqual(t, "0", port, "the bound port, not the one asked for")

	ids := func(first, n int) []int {
		out := make([]int, n)
		for i := range out {
			out[i] = FirstWordID + (first+7*i)%VocabWords
		}
		return out
	}
	a := ids(1, 40)                                              // 2 full blocks and 8 tokens
	a2 := append(append([]int(nil), a[:36]...), ids(500, 14)...) // shares 2 full blocks (and 4 tokens) with a
	for _, c := range []struct {
		name           string
		prompt         []int
		cached, staged int
	}{{"a", a, 0, 3}, {"a2", a2, 32, 2}, {"unrelated", ids(900, 20), 0, 2}, {"a again", a, 32, 1}} {
		res, err := proxy.Do(ctx, CompletionRequest{Model: Qwen3_0_6B.Name, PromptTokenIDs: c.prompt, MaxTokens: 2}, "req-"+c.name)
		require.NoError(t, err, c.name)
		p, d := res.Prefill.Gonixl, res.Decode.Gonixl
		require.NotNil(t, p, c.name)
		assert.Equal(t, c.cached, p.CachedTokens, "%s: cached tokens", c.name)
		assert.Equal(t, c.cached/16, p.CachedBlocks, "%s: cached blocks", c.name)
		assert.Equal(t, c.staged, p.StagedBlocks, "%s: staged blocks", c.name)
		require.NotNil(t, d, c.name)
		assert.True(t, d.Verified, c.name)
		assert.Equal(t, d.Bytes, d.VerifiedBytes, "%s: the decode checked every byte it read", c.name)
		assert.Equal(t, (len(c.prompt)+15)/16, d.Blocks, c.name)
	}
}

// The prefix-cache flags: off by default; events, replay, topic and the hash seed only with the cache.
func TestPrefixFlags(t *testing.T) {
	parse := func(args ...string) (*connector.PrefixCacheConfig, *connector.KVEventsConfig, error) {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		blocks := fs.Int("prefix-cache-blocks", 0, "")
		events, replay, topic := fs.String("kv-events", "", ""), fs.String("kv-events-replay", "", ""), fs.String("kv-events-topic", "", "")
		seed := fs.String("python-hash-seed", "", "")
		require.NoError(t, fs.Parse(args))
		return prefixFlags(fs, *blocks, *events, *replay, *topic, *seed)
	}
	pc, ev, err := parse()
	require.NoError(t, err)
	assert.Nil(t, pc)
	assert.Nil(t, ev)
	pc, ev, err = parse("-prefix-cache-blocks", "64")
	require.NoError(t, err)
	assert.Equal(t, &connector.PrefixCacheConfig{MaxBlocks: 64}, pc)
	assert.Nil(t, ev)
	pc, ev, err = parse("-prefix-cache-blocks", "8", "-kv-events", "127.0.0.1:0", "-kv-events-replay", "127.0.0.1:0", "-kv-events-topic", "kv", "-python-hash-seed", "0")
	require.NoError(t, err)
	require.NotNil(t, pc.PythonHashSeed)
	assert.Equal(t, "0", *pc.PythonHashSeed)
	assert.Equal(t, &connector.KVEventsConfig{Addr: "127.0.0.1:0", ReplayAddr: "127.0.0.1:0", Topic: "kv"}, ev)
	for _, bad := range [][]string{
		{"-kv-events", "127.0.0.1:0"},
		{"-python-hash-seed", "1"},
		{"-prefix-cache-blocks", "8", "-kv-events-replay", "127.0.0.1:0"},
		{"-prefix-cache-blocks", "-1"},
	} {
		_, _, err := parse(bad...)
		assert.Error(t, err, "%v", bad)
	}
}
