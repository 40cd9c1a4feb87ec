package kvevents_test

import (
	"fmt"

	"github.com/gonixl/gonixl/connector/kvevents"
)

// A prefill worker publishes what it caches and evicts; a consumer subscribes to Addr and replays from
// ReplayAddr (vLLM's --kv-events-config endpoint and replay_endpoint).
func ExampleNew() {
	format, err := kvevents.FormatFor("0.33.0") // the release the consumers expect
	if err != nil {
		panic(err)
	}
	pub, err := kvevents.New(kvevents.Config{Format: format, Addr: "127.0.0.1:0", ReplayAddr: "127.0.0.1:0", Topic: "kv@prefill-0"})
	if err != nil {
		panic(err)
	}
	defer pub.Close()

	// Two full blocks of 4 tokens stored, the first block of a prompt (no parent); then one evicted.
	first, second := kvevents.IntHash(0x1111), kvevents.IntHash(0x2222)
	seq, err := pub.Publish(kvevents.Batch{Events: []kvevents.Event{&kvevents.BlockStored{
		BlockHashes: []kvevents.BlockHash{first, second}, TokenIDs: []int64{1, 2, 3, 4, 5, 6, 7, 8}, BlockSize: 4,
		Medium: kvevents.Ptr("CPU"),
	}}})
	if err != nil {
		panic(err)
	}
	fmt.Println("stored as", seq)
	seq, err = pub.Publish(kvevents.Batch{Events: []kvevents.Event{&kvevents.BlockRemoved{BlockHashes: []kvevents.BlockHash{second}}}})
	if err != nil {
		panic(err)
	}
	fmt.Println("removed as", seq)
	st := pub.Stats()
	fmt.Println("published", st.Published, "dropped", st.Dropped)
	// Output:
	// stored as 0
	// removed as 1
	// published 2 dropped 0
}
