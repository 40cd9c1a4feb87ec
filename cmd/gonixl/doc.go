// Command gonixl is the operator tool of gonixl: it answers, from a shell, the questions people debugging
// disaggregated serving ask — what does this prefill worker advertise, can this host load NIXL, how fast is
// the link.
//
//	gonixl env [--json] [--require nixl,cuda]
//	gonixl probe tcp://HOST:PORT --vllm-version X [--rank pp,tp …] [--model M --kv-heads N …] [--json]
//	gonixl inspect FILE|- [--kind auto|metadata|payload|params] [--vllm-version X] [--json]
//	gonixl bench [--op READ,WRITE] [--min-block 4KiB --max-block 1MiB] [--batch 1,32] [--json]
//	gonixl bench --serve --listen 0.0.0.0:7700      (target host)
//	gonixl bench --peer TARGET:7700                 (initiator host)
//
// env reports where NIXL (with its plugins' memory types and default parameters), libzmq, the CUDA driver
// and the Neuron runtime were found, or every place tried. probe runs the decode side of vLLM's NixlConnector
// handshake (the ZMQ side channel) against a live prefill worker — vLLM's or gonixl's — and prints the
// payload: compatibility hash (checked against a local configuration when --model is given), engine id, the
// NIXL agent name (the metadata loaded into a throwaway agent), block geometry and region addresses.
// inspect decodes a captured NixlAgentMetadata, NixlHandshakePayload or kv_transfer_params. bench measures
// NIXL READ/WRITE throughput and latency between two agents, in this process or across hosts; the two
// processes of a remote bench exchange NIXL metadata over a plain TCP connection carrying one JSON object
// per line (hello with the initiator's metadata and buffer size, welcome with the target's metadata, buffer
// address and pattern seed, goodbye).
//
// Every command has -h. Output goes to stdout (text, or JSON with --json); a failure is one line on stderr
// and exit status 1 (2 for a bad command line), never a stack trace. NIXL's own logging is set to FATAL
// unless NIXL_LOG_LEVEL or --nixl-log-level says otherwise, so that stderr stays readable.
//
// The program is a thin layer over the packages nixl, connector/protocol, connector/sidechannel, cuda and
// neuron; main is run(args, stdout, stderr), which the tests call directly.
package main
