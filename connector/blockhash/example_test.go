package blockhash_test

import (
	"fmt"

	"github.com/gonixl/gonixl/connector/blockhash"
)

// A prefill worker hashes a prompt's full blocks as the vLLM 0.33 engines it works with do (their default
// sha256, PYTHONHASHSEED unset): equal hashes mean an equal prefix, so a cached block can be found by hash.
func ExampleNew() {
	rel, err := blockhash.ReleaseFor("0.33.0")
	if err != nil {
		panic(err)
	}
	h, err := blockhash.New(blockhash.Config{Release: rel, BlockSize: 4})
	if err != nil {
		panic(err)
	}
	first, err := h.Hashes([]int64{1, 2, 3, 4, 5, 6, 7, 8, 9}, "")
	if err != nil {
		panic(err)
	}
	second, err := h.Hashes([]int64{1, 2, 3, 4, 5, 6, 7, 0}, "")
	if err != nil {
		panic(err)
	}
	fmt.Println(len(first), "full blocks; shared prefix blocks:", first[0] == second[0], first[1] == second[1])
	fmt.Println(h.Algo(), "seeded with", h.Seed())
	// Output:
	// 2 full blocks; shared prefix blocks: true false
	// sha256 seeded with vllm-none-hash
}
