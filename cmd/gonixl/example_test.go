package main

import (
	"os"
	"path/filepath"
)

// Decoding a captured kv_transfer_params (what a prefill worker returns and the proxy hands to decode):
// `gonixl inspect FILE` detects the kind and the vLLM profile.
func Example_inspect() {
	dir, _ := os.MkdirTemp("", "gonixl-example-")
	defer os.RemoveAll(dir)
	file := filepath.Join(dir, "params.json")
	_ = os.WriteFile(file, []byte(`{"do_remote_prefill": true, "do_remote_decode": false, "remote_block_ids": [1, 2, 3], `+
		`"remote_engine_id": "e0", "remote_request_id": "cmpl-1", "remote_host": "10.0.0.5", "remote_port": 5600, "tp_size": 1}`), 0o644)
	run([]string{"inspect", file}, os.Stdout, os.Stderr)
	// Output:
	// kind                   kv_transfer_params (204 bytes)
	// profile                vLLM 0.16 (H2, connector v2)
	// do_remote_prefill      true
	// do_remote_decode       false
	// remote_block_ids       [1, 2, 3]
	// remote_engine_id       "e0"
	// remote_request_id      "cmpl-1"
	// remote_host            "10.0.0.5"
	// remote_port            5600
	// tp_size                1
	// usable by a decoder    yes (3 block ids in 1 group(s))
}

// A bad command line is one line on stderr and exit status 2.
func Example_badFlag() {
	run([]string{"probe", "--no-such-flag"}, os.Stdout, os.Stdout)
	// Output:
	// gonixl probe: flag provided but not defined: -no-such-flag (see `gonixl probe -h`)
}
