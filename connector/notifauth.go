package connector

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"strings"
	"sync"

	"go.uber.org/zap"
)

// remoteIDSep separates a request id from the unguessable suffix in the remote_request_id a prefill role
// hands out: "<request id>~<32 hex digits>". vLLM's decode side echoes remote_request_id verbatim in its
// notifications ("<remote_request_id>:<n>", parsed at the last ':') and heartbeats ("HB:<id>,<id>,…"), so the
// suffix holds neither ':' nor ','.
const remoteIDSep = "~"

// minNotifyKey is the shortest PrefillConfig.NotifyKey NewPrefill takes.
const minNotifyKey = 16

// serverKeys holds the notification key of the prefill ranks sharing one side-channel server (one engine's
// ranks in one process), so that they hand out the same remote_request_id for a request, as one vLLM
// scheduler does.
var serverKeys sync.Map // *sidechannel.Server → []byte (PrefillConfig.SideChannel)

// notifyKey is the role's key of the suffix: PrefillConfig.NotifyKey, else the key of its shared side channel,
// else a random one.
func notifyKey(cfg PrefillConfig) []byte {
	if len(cfg.NotifyKey) > 0 {
		return append([]byte(nil), cfg.NotifyKey...)
	}
	k := make([]byte, 32)
	_, _ = rand.Read(k)
	if cfg.SideChannel != nil {
		v, _ := serverKeys.LoadOrStore(cfg.SideChannel, k)
		return v.([]byte)
	}
	return k
}

// notifToken is a request id's 128-bit suffix: HMAC-SHA256 of the id under the role's key, the same on every
// rank of an engine that shares the key.
func (p *Prefill) notifToken(requestID string) string {
	m := hmac.New(sha256.New, p.notifyKey)
	m.Write([]byte(requestID))
	return hex.EncodeToString(m.Sum(nil)[:16])
}

// LocalRequestID returns the request id a Go prefill worker's remote_request_id was made from (the id
// given to Prefill.Hold): the remote id without its unguessable suffix, or the whole string when it has none
// (a vLLM prefill worker's ids).
func LocalRequestID(remoteRequestID string) string {
	id, _, _ := splitRemoteID(remoteRequestID)
	return id
}

func splitRemoteID(remote string) (id, token string, ok bool) {
	i := strings.LastIndex(remote, remoteIDSep)
	if i < 0 || len(remote)-i-len(remoteIDSep) != 32 {
		return remote, "", false
	}
	return remote[:i], remote[i+len(remoteIDSep):], true
}

// heldFor returns the held request a notification's remote request id names, or nil. forged is set when the
// id names a held request without that request's suffix: someone who did not get the request's params (the
// suffix is only in them) sent it. Called with p.mu held.
func (p *Prefill) heldFor(remote string) (h *heldReq, forged bool) {
	id, token, _ := splitRemoteID(remote)
	h = p.held[id]
	if h == nil {
		return nil, false
	}
	if subtle.ConstantTimeCompare([]byte(token), []byte(h.token)) != 1 {
		return nil, true
	}
	return h, false
}

// forged counts and logs (sampled: logPeerLine) a notification or heartbeat entry with a wrong
// suffix: a flood of forgeries cannot flood the log.
func (p *Prefill) forged(from, remote string, heartbeat bool) {
	if n := p.metrics.forgedNotifications.Add(1); logPeerLine(n) {
		p.log.Warn("forged notification dropped: the request id lacks the suffix handed out with the request's kv_transfer_params",
			zap.String("from", from), zap.String("request_id", LocalRequestID(remote)), zap.Bool("heartbeat", heartbeat),
			zap.Int64("forged_so_far", n))
	}
}
