package main

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gonixl/gonixl/examples/internal/demo"
)

// TestCheck shows that Check refuses each way a request can go wrong between the prefill and the decode.
func TestCheck(t *testing.T) {
	const id = "0ec70320-0824-4a08-b3b5-fdbe3692ed08"
	params := func(rid string, blocks string) json.RawMessage {
		return json.RawMessage(`{"kv_transfer_params":{"do_remote_prefill":true,"remote_block_ids":[` + blocks +
			`],"remote_engine_id":"gonixl-p-1","remote_request_id":"` + rid + `","remote_host":"127.0.0.1","remote_port":5600}}`)
	}
	good := func() (map[string]record, map[string]record) {
		p := record{Role: "prefill", RequestID: id, PromptTokens: 17, Emitted: params(id, "[1,2]")}
		d := record{Role: "decode", RequestID: id, PromptTokens: 17, Received: params(id, "[1,2]"),
			Gonixl: &demo.Timing{Bytes: 100, VerifiedBytes: 100, Verified: true}}
		return map[string]record{id: p}, map[string]record{id: d}
	}
	res := completion{ID: "cmpl-" + id}
	p, d := good()
	proof, err := Check(res, 17, p, d)
	require.NoError(t, err)
	require.Equal(t, id, proof.Decode.RequestID)

	for name, spoil := range map[string]func(p, d map[string]record){
		"no prefill record": func(p, d map[string]record) { delete(p, id) },
		"no decode record":  func(p, d map[string]record) { delete(d, id) },
		"params changed": func(p, d map[string]record) {
			r := d[id]
			r.Received = params(id, "[1,3]")
			d[id] = r
		},
		"remote_request_id not Dynamo's": func(p, d map[string]record) {
			r, q := p[id], d[id]
			r.Emitted, q.Received = params("other", "[1,2]"), params("other", "[1,2]")
			p[id], d[id] = r, q
		},
		"prompt length": func(p, d map[string]record) {
			r := d[id]
			r.PromptTokens = 16
			d[id] = r
		},
		"not verified": func(p, d map[string]record) {
			r := d[id]
			r.Gonixl = &demo.Timing{Bytes: 100, VerifiedBytes: 100}
			d[id] = r
		},
		"verified fewer bytes": func(p, d map[string]record) {
			r := d[id]
			r.Gonixl = &demo.Timing{Bytes: 100, VerifiedBytes: 99, Verified: true}
			d[id] = r
		},
		"no timings": func(p, d map[string]record) {
			r := d[id]
			r.Gonixl = nil
			d[id] = r
		},
		"bare params (not Dynamo's vLLM shape)": func(p, d map[string]record) {
			r, q := p[id], d[id]
			r.Emitted = json.RawMessage(`{"remote_request_id":"` + id + `"}`)
			q.Received = r.Emitted
			p[id], d[id] = r, q
		},
	} {
		t.Run(name, func(t *testing.T) {
			p, d := good()
			spoil(p, d)
			_, err := Check(res, 17, p, d)
			require.Error(t, err)
		})
	}
}
