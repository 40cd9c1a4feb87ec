package connector

import (
	"context"
	"fmt"
	"runtime/trace"
	"time"

	"github.com/gonixl/gonixl/nixl"
)

// hostBufferedSlices is how many READ slices a request into a HostBufferedPipeline cache is cut into (at most
// one block each): eight slices, each overlapped with one batch copy (BenchmarkDRAMToVRAM's hostbuf_x_batchcopy,
// docs/measured.md).
const hostBufferedSlices = 8

// pullSliced READs a request into a pipelined host-buffered cache slice by slice: every slice is posted at
// once, each slice's host → device copy starts as soon as its READs are done, and the notification goes to
// every source once all READs are done. It fills res.Bytes, res.Transfer (post to the last READ's completion)
// and res.Copy (the copies' tail after that), and records the phases (prepare and post summed over the
// slices, wait from the last post, notify, copy). It applies only with a block size ratio of 1. A failed READ or
// notification is readErr (the handshake is then dropped); a failed copy is copyErr.
func (d *Decode) pullSliced(ctx context.Context, re *remoteEngine, hb HostBufferedPipeline, req pullRequest, res *Result) (readErr, copyErr error) {
	localBlocks, ids := req.local, req.remote
	n := len(localBlocks)
	per := max(1, (n+hostBufferedSlices-1)/hostBufferedSlices)
	type slice struct {
		blocks []int
		xfers  []*nixl.Xfer
	}
	var slices []slice
	defer func() {
		for _, s := range slices {
			for _, x := range s.xfers {
				_ = x.Close()
			}
		}
	}()
	opts := d.reg.xferOpts(nil)[1:] // no notification on the slices
	start := time.Now()
	prepare, post := req.planned, time.Duration(0)
	err := d.reg.do(func() error {
		defer trace.StartRegion(ctx, "gonixl.prepare+post").End()
		for a := 0; a < n; a += per {
			b := min(a+per, n)
			t := time.Now()
			li, ri := re.plan.AppendIndices(nil, nil, localBlocks[a:b], ids[a:b])
			s := slice{blocks: localBlocks[a:b]}
			for _, src := range re.sources {
				x, err := d.reg.agent.MakeXfer(nixl.Read, src.local, li, src.remote, ri, opts...)
				if err != nil {
					return err
				}
				s.xfers = append(s.xfers, x)
				t2 := time.Now()
				prepare += t2.Sub(t)
				_, err = x.Post()
				t = time.Now()
				post += t.Sub(t2)
				if err != nil {
					slices = append(slices, s)
					return err
				}
				res.Bytes += int64(len(li)) * src.pairLen
			}
			slices = append(slices, s)
		}
		return nil
	})
	d.metrics.observe(timingPrepare, prepare)
	res.Post = post
	d.metrics.observe(timingPost, post)
	agents := re.agents()
	if err == nil {
		r := trace.StartRegion(ctx, "gonixl.wait")
		posted := time.Now()
		stopHB := d.heartbeat(ctx, agents, req.kv.RemoteRequestID, false)
	wait:
		for _, s := range slices {
			for _, x := range s.xfers {
				if err = x.Wait(ctx); err != nil {
					break wait
				}
			}
			if copyErr = hb.StartCopyToDevice(s.blocks); copyErr != nil {
				break
			}
		}
		stopHB()
		res.Wait = time.Since(posted)
		d.metrics.observe(timingWait, res.Wait)
		r.End()
	}
	res.Transfer = time.Since(start)
	if err != nil {
		return err, nil
	}
	r := trace.StartRegion(ctx, "gonixl.notify")
	t := time.Now()
	for _, a := range agents {
		if err := d.reg.agent.SendNotification(a, req.notif); err != nil {
			r.End()
			return fmt.Errorf("notifying prefill agent %s: %w", a, err), nil
		}
	}
	d.metrics.observe(timingNotify, time.Since(t))
	r.End()
	if copyErr != nil {
		return nil, fmt.Errorf("connector: host → device copy: %w", copyErr)
	}
	r = trace.StartRegion(ctx, "gonixl.copy")
	t = time.Now()
	err = hb.WaitCopies(ctx)
	res.Copy = time.Since(t)
	r.End()
	if err != nil {
		return nil, fmt.Errorf("connector: host → device copy: %w", err)
	}
	d.metrics.observe(timingCopy, res.Copy)
	return nil, nil
}
