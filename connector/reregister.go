package connector

import (
	"errors"
	"fmt"

	"go.uber.org/zap"

	"github.com/gonixl/gonixl/connector/protocol"
	"github.com/gonixl/gonixl/nixl"
)

// ErrBusy is returned by Prefill.Reregister while requests are held for decode peers or being prefilled.
var ErrBusy = errors.New("connector: requests are in flight")

// Reregister registers the cache with NIXL again — after its memory was reallocated or re-pinned (the cache's
// RegionBases may have changed; its geometry must not) — publishes the new handshake on the side channel and
// bumps remote_registration_generation, as vLLM's prefill does when it publishes a changed handshake (a wake-up
// after sleep): decode peers that see the larger generation drop their cached handshake and handshake again
// (vLLM 0.33+; older rows carry no generation, and their decode peers handshake again after a failed READ).
// Requests must not be held or in prefill (ErrBusy: let them finish, or Abort them). With a prefix cache,
// every cached block is dropped first (their contents went with the old memory; KV events: AllBlocksCleared),
// as vLLM resets its prefix cache when it wakes up. It returns the new generation.
func (p *Prefill) Reregister() (int64, error) {
	p.regMu.Lock()
	defer p.regMu.Unlock()
	if p.regClosed {
		return 0, errors.New("connector: Reregister after Close")
	}
	// Hold p.mu throughout, so no prefill starts (and publishes the old generation) while the cache is
	// registered again; the notification loop waits too, which is fine for a rare operation.
	p.mu.Lock()
	defer p.mu.Unlock()
	busy := len(p.held) + len(p.pending)
	if busy > 0 {
		return 0, fmt.Errorf("%w: %d requests held or being prefilled; Abort them or wait before registering the cache again", ErrBusy, busy)
	}
	if g := p.cfg.Cache.Geometry(); g != p.reg.geom {
		return 0, fmt.Errorf("connector: the cache's geometry changed (%v, was %v); start a new Prefill instead", g, p.reg.geom)
	}
	if p.prefix != nil {
		p.prefix.reset()
	}
	if err := p.reg.reg.Close(); err != nil {
		return 0, fmt.Errorf("connector: deregistering the KV cache: %w", err)
	}
	var reg *nixl.Registration
	err := p.reg.registering(func() (err error) { reg, err = p.reg.registerCache(); return err })
	if err != nil {
		p.reg.reg = nil
		return 0, err
	}
	p.reg.reg = reg
	payload, err := p.handshakePayload()
	if err != nil {
		return 0, err
	}
	gen := p.generation.Add(1)
	p.sideChannel().SetPayload(p.cfg.Rank, payload)
	p.log.Info("KV cache registered again; decode peers handshake again", zap.Int64("registration_generation", gen))
	return gen, nil
}

// publishedBackend is the attn_backend_name the handshake carries: the hash input, or the row's default for
// the platform when it is left empty (what the hash uses then).
func (p *Prefill) publishedBackend() string {
	return backendName(p.cfg.Profile, p.cfg.Compat.CompatInputs)
}

func backendName(pr protocol.Profile, in protocol.CompatInputs) string {
	if in.AttnBackendName != "" {
		return in.AttnBackendName
	}
	pl := in.Platform
	if pl == "" {
		pl = protocol.PlatformCUDA
	}
	return pr.Defaults.AttnBackend[pl]
}
