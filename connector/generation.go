package connector

import "go.uber.org/zap"

// Registration generations (kv_transfer_params.remote_registration_generation, vLLM 0.33+): a prefill engine
// counts how often it registered its KV cache, and a decode worker that sees a larger number than the one it
// recorded for that engine drops its cached handshake and handshakes again (vLLM 0.33's
// NixlPullConnectorWorker._read_blocks_for_req). Rows without the key always carry 0 and never trigger it.

// advanceGeneration records gen for engineID and drops the cached handshake when gen is larger than the
// recorded one (the first generation seen only records it, like vLLM's dict.get(engine_id, 0) < generation
// with nothing cached yet). It reports whether a cached handshake was dropped.
func (d *Decode) advanceGeneration(engineID string, gen int64) bool {
	d.mu.Lock()
	if d.generations == nil {
		d.generations = map[string]int64{}
	}
	if gen <= d.generations[engineID] {
		d.mu.Unlock()
		return false
	}
	re := d.remotes[engineID]
	if re != nil {
		select {
		case <-re.once: // a finished handshake: drop it below
		default: // one in progress may predate the new registration: record nothing, the next pull checks again
			d.mu.Unlock()
			return false
		}
	}
	d.generations[engineID] = gen
	d.mu.Unlock()
	if re == nil {
		return false
	}
	d.forget(engineID, re)
	d.log.Info("prefill engine registered its KV cache again; handshaking again",
		zap.String("remote_engine_id", engineID), zap.Int64("registration_generation", gen))
	return true
}
