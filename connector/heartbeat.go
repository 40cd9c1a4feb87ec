package connector

import (
	"context"
	"fmt"
	"runtime/trace"
	"sync"
	"time"

	"github.com/gonixl/gonixl/connector/protocol"
	"github.com/gonixl/gonixl/nixl"
)

// KeepAlive renews the prefill side's lease on a request's blocks from the moment the decode worker has its
// kv_transfer_params until it pulls them, as vLLM's decode worker does for a request that waits (its scheduler
// heartbeats every request from arrival, not only during the READ). It handshakes with the prefill engine
// (cached and shared with Pull), sends an "HB:" heartbeat at once and then every Profile.HeartbeatInterval to
// each prefill agent the request is read from, until stop is called, ctx ends or the role is closed.
//
// Call stop once Pull has returned or the request is dropped; it is idempotent. On rows without leases
// (vLLM before 0.22, where unread blocks wait for the abort timeout) KeepAlive only handshakes.
func (d *Decode) KeepAlive(ctx context.Context, kv protocol.KVTransferParams) (stop func(), err error) {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return func() {}, fmt.Errorf("connector: keep-alive for %s: the decode role is closed: %w", kv.RemoteRequestID, nixl.ErrClosed)
	}
	d.pulls.Add(1) // Close waits for the heartbeats to stop before it closes the agent
	d.mu.Unlock()
	agents, err := d.keepAliveAgents(ctx, kv)
	p := d.cfg.Profile
	if err != nil || !p.Leases || p.HeartbeatInterval <= 0 {
		d.pulls.Done()
		return func() {}, err
	}
	stopHB := d.heartbeat(ctx, agents, kv.RemoteRequestID, true)
	var once sync.Once
	end := func() { once.Do(func() { stopHB(); d.pulls.Done() }) }
	stopOnClose := context.AfterFunc(d.closing, end)
	stopOnCtx := context.AfterFunc(ctx, end)
	return func() { stopOnClose(); stopOnCtx(); end() }, nil
}

// keepAliveAgents checks kv as Pull does (without local blocks) and returns the prefill agents the request
// is read from, handshaking if needed.
func (d *Decode) keepAliveAgents(ctx context.Context, kv protocol.KVTransferParams) ([]string, error) {
	req, err := newPullRequest(kv)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(d.closing, cancel)()
	re, _, err := d.engine(ctx, req)
	if err != nil {
		return nil, err
	}
	defer d.hs.put(re)
	return re.agents(), nil
}

// heartbeat renews the request's lease on every prefill agent read, every Profile.HeartbeatInterval (and at
// once when now is set) until the returned stop is called, in profiles with leases.
func (d *Decode) heartbeat(ctx context.Context, agents []string, remoteRequestID string, now bool) (stop func()) {
	p := d.cfg.Profile
	if !p.Leases || p.HeartbeatInterval <= 0 {
		return func() {}
	}
	msg, err := p.EncodeHeartbeat([]string{remoteRequestID})
	if err != nil {
		return func() {}
	}
	beat := func() {
		defer trace.StartRegion(ctx, "gonixl.heartbeat").End()
		t := time.Now()
		for _, a := range agents {
			if err := d.reg.agent.SendNotification(a, msg); err == nil {
				d.metrics.heartbeats.Add(1)
			}
		}
		d.metrics.observe(timingHeartbeat, time.Since(t))
	}
	if now {
		beat()
	}
	quit := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(p.HeartbeatInterval)
		defer t.Stop()
		for {
			select {
			case <-quit:
				return
			case <-t.C:
				beat()
			}
		}
	}()
	return func() { close(quit); <-done }
}
