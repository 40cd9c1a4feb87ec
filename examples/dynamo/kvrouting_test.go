package main

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gonixl/gonixl/examples/internal/demo"
)

// TestDynamoKVRouting runs two Go prefill workers with prefix caches behind Dynamo's frontend (router mode kv),
// each publishing vLLM's KV events, which its Dynamo prefill worker declares as a ZmqSource. The router sends a
// prompt that shares a long prefix with an earlier one to the worker holding that prefix, and that Go worker
// reuses the cached blocks: it reports the cached tokens and computes and stages only the other blocks, while
// the decode still verifies every byte. Both directions: prompt A lands on some worker wA; a prompt B is put
// into the other worker wB directly (not through Dynamo: the router learns of it only from wB's KV events);
// then B's and A's prefixes go to wB and wA respectively. An unrelated prompt hits no cache; which worker the
// router picks for it is its load-based choice (every worker scores the same overlap, none), so that is not
// asserted. Each record names the worker that served it, and its kv_transfer_params carry that Go worker's
// engine id. The router applied every KV event it got (no unknown parent, no undecodable batch).
func TestDynamoKVRouting(t *testing.T) {
	cl := newCluster(t, 30*time.Second, 2, 1024, 2, "-prefix-cache-blocks", "128", "-kv-events", "127.0.0.1:0")
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	require.NoError(t, cl.WaitKVRouting(ctx))
	r0, err := cl.RouterKV(ctx)
	require.NoError(t, err)

	worker := func(name string) int {
		i := slices.Index(cl.PrefillNames, name)
		require.GreaterOrEqual(t, i, 0, "a prefill record names worker %q", name)
		return i
	}
	// send sends a prompt through Dynamo, proves it from the records (Check: the decode verified every byte)
	// and checks that the prefill record's Go worker is the one whose engine id its params carry.
	send := func(name string, words []string) record {
		t.Helper()
		res, err := cl.Complete(ctx, strings.Join(words, " "), 2, false)
		require.NoError(t, err, name)
		prefill, decode, err := cl.RequestRecords()
		require.NoError(t, err)
		proof, err := Check(res, len(words), prefill, decode)
		require.NoError(t, err, name)
		p := proof.Prefill
		var params map[string]map[string]any
		require.NoError(t, json.Unmarshal(p.Emitted, &params))
		require.Equal(t, cl.PrefillEngines[worker(p.Worker)], params["kv_transfer_params"]["remote_engine_id"], "%s: the record's worker is the Go worker that held the blocks", name)
		require.NotNil(t, p.Gonixl, name)
		g := p.Gonixl
		require.Equal(t, (len(words)+15)/16, g.Blocks, name)
		require.Equal(t, g.Blocks-g.CachedBlocks, g.StagedBlocks, "%s: only the blocks not cached were staged", name)
		require.Equal(t, 16*g.CachedBlocks, g.CachedTokens, name)
		t.Logf("%s (%d tokens): %s, %d tokens cached (%d blocks), %d blocks staged; decode verified %d bytes",
			name, len(words), p.Worker, g.CachedTokens, g.CachedBlocks, g.StagedBlocks, proof.Decode.Gonixl.VerifiedBytes)
		return p
	}
	// selected sends a prompt after the router took in every KV event published so far, and checks the
	// router's own count of the cached prefix tokens of the worker it chose against what that worker reused.
	selected := func(name string, words []string) record {
		t.Helper()
		before, err := cl.SyncKV(ctx)
		require.NoError(t, err)
		p := send(name, words)
		after, err := cl.RouterKV(ctx)
		require.NoError(t, err)
		require.Equal(t, float64(p.Gonixl.CachedTokens), after.SelectedCached-before.SelectedCached,
			"%s: the router's cached prefix tokens of the worker it chose, and that Go worker's reused tokens", name)
		return p
	}

	a := words(1, 320)
	ra := selected("A", a)
	require.Zero(t, ra.Gonixl.CachedTokens, "A: nothing cached yet")
	wA := worker(ra.Worker)
	wB := 1 - wA

	ra2 := selected("A's prefix", slices.Concat(a[:256], words(2, 64)))
	require.Equal(t, cl.PrefillNames[wA], ra2.Worker, "A's prefix goes to A's worker")
	require.Equal(t, 256, ra2.Gonixl.CachedTokens)

	// B into the other Go prefill directly (vLLM's own disaggregated flow, through the Go decode): only its KV
	// events tell the router.
	b := words(3, 320)
	seed, err := (&demo.Proxy{Prefill: cl.GoPrefillURLs[wB], Decode: cl.GoDecodeURL}).Do(ctx,
		demo.CompletionRequest{Model: cl.cfg.Model, Prompt: strings.Join(b, " "), MaxTokens: 2}, "seed-b")
	require.NoError(t, err)
	require.Zero(t, seed.Prefill.Gonixl.CachedTokens)
	require.True(t, seed.Decode.Gonixl.Verified)
	require.Equal(t, seed.Decode.Gonixl.Bytes, seed.Decode.Gonixl.VerifiedBytes)

	rb2 := selected("B's prefix", slices.Concat(b[:288], words(4, 32)))
	require.Equal(t, cl.PrefillNames[wB], rb2.Worker, "B's prefix goes to B's worker, which only its KV events made known")
	require.Equal(t, 288, rb2.Gonixl.CachedTokens)

	ra3 := selected("A's prefix again", slices.Concat(a[:304], words(5, 16)))
	require.Equal(t, cl.PrefillNames[wA], ra3.Worker, "and back: A's prefix goes to A's worker")
	require.Equal(t, 304, ra3.Gonixl.CachedTokens)

	rc := selected("unrelated", words(6, 200))
	require.Zero(t, rc.Gonixl.CachedTokens, "a prompt no worker holds hits no cache")

	r, err := cl.SyncKV(ctx)
	require.NoError(t, err)
	for k, v := range r.Applied {
		if !strings.HasSuffix(k, "/ok") {
			require.Equal(t, r0.Applied[k], v, "the router refused KV events: %s", k)
		}
	}
	require.Greater(t, r.Applied["stored/ok"], r0.Applied["stored/ok"])
}

// words is prompt i's first n words as a slice (prompt's words: one token each).
func words(i, n int) []string { return strings.Fields(prompt(i, n)) }
