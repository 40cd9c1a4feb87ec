package main

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/gonixl/gonixl/connector"
	"github.com/gonixl/gonixl/nixl"
)

const benchHelp = `Measures NIXL transfer throughput and latency between two agents over a sweep of descriptor (block)
sizes and batch sizes (descriptors per transfer request), like nixlbench: for each point one request is
made and posted --iters times; each post is timed until NIXL reports it complete.

Before the sweep the data path is verified: the initiator READs the target's whole buffer and checks a
known pattern, then WRITEs its own pattern and READs it back.

Modes:
  local   (default) two agents in this process, memory registered as DRAM on both sides
  remote  on the target host:     gonixl bench --serve --listen 0.0.0.0:7700
          on the initiator host:  gonixl bench --peer TARGET:7700
          The agents exchange NIXL metadata over that plain TCP connection (JSON lines); the transfers
          themselves go over the NIXL backend (UCX by default).

The progress line goes to stderr (when it is a terminal, or with --progress on); the table to stdout.

Examples:
  gonixl bench
  gonixl bench --op READ --min-block 4KiB --max-block 16MiB --batch 1,32 --iters 500 --json`

// benchRow is one measured point of the sweep.
type benchRow struct {
	Op        string  `json:"op"`
	BlockSize int64   `json:"block_size"`
	Batch     int     `json:"batch_size"`
	Iters     int     `json:"iterations"`
	Bytes     int64   `json:"bytes_per_request"`
	GBps      float64 `json:"gb_per_s"`
	AvgLatUs  float64 `json:"avg_latency_us"`
	P99LatUs  float64 `json:"p99_latency_us"`
	MinLatUs  float64 `json:"min_latency_us"`
}

type benchReport struct {
	Mode      string     `json:"mode"` // local, remote
	Peer      string     `json:"peer,omitempty"`
	Backends  string     `json:"backends"`
	Initiator string     `json:"initiator_agent"`
	Target    string     `json:"target_agent"`
	Verified  bool       `json:"verified"`
	Rows      []benchRow `json:"rows"`
}

type benchConfig struct {
	ops        []nixl.Op
	blocks     []int64
	batches    []int
	iters      int
	warmup     int
	pointTime  time.Duration
	xferTimout time.Duration
	backends   []nixl.BackendSpec
	progress   func(label, detail string)
}

// memBytes is the buffer each side needs: the largest block times the largest batch.
func (c *benchConfig) memBytes() int64 {
	return slices.Max(c.blocks) * int64(slices.Max(c.batches))
}

// benchTarget is the registered buffer of the target agent, as seen by the initiator.
type benchTarget struct {
	agent string
	addr  uint64
	len   uint64
	seed  uint64
}

func runBench(ctx context.Context, env *cmdEnv, args []string) error {
	fs := newFlagSet(env, benchHelp)
	var nf nixlFlags
	nf.register(fs)
	ops := fs.String("op", "READ,WRITE", "operations to measure: READ, WRITE or both (comma-separated)")
	minBlock := fs.String("min-block", "4KiB", "smallest block (descriptor) size of the sweep")
	maxBlock := fs.String("max-block", "1MiB", "largest block size; the sweep doubles from --min-block")
	blockList := fs.String("block-sizes", "", "explicit comma-separated block sizes (overrides --min-block/--max-block)")
	batchList := fs.String("batch", "1,32", "comma-separated batch sizes: descriptors per transfer request")
	iters := fs.Int("iters", 200, "timed posts per point")
	warmup := fs.Int("warmup", 10, "untimed posts per point before timing")
	pointTime := fs.Duration("point-time", 3*time.Second, "stop a point's timed posts after this long (at least 3 are kept)")
	xferTimeout := fs.Duration("xfer-timeout", 30*time.Second, "fail when one transfer takes longer than this")
	backends := fs.String("backends", "UCX", "NIXL backends of the agents (comma-separated)")
	asJSON := fs.Bool("json", false, "print the results as JSON")
	progress := fs.String("progress", "auto", "progress line on stderr: auto (when stderr is a terminal), on, off")
	serve := fs.Bool("serve", false, "be the target of a remote bench: accept initiators on --listen")
	listen := fs.String("listen", "127.0.0.1:7700", "with --serve: address to listen on (use 0.0.0.0:PORT across hosts)")
	once := fs.Bool("once", false, "with --serve: exit after one initiator")
	maxMem := fs.String("max-mem", "4GiB", "with --serve: largest buffer an initiator may ask for; else: refuse sweeps needing more")
	peer := fs.String("peer", "", "run against a remote `gonixl bench --serve` at HOST:PORT instead of a local target")
	timeout := fs.Duration("timeout", 10*time.Second, "with --peer / --serve: bound on connecting and exchanging metadata")
	if err := parseNone(fs, args); err != nil {
		return err
	}
	limit, err := parseSize(*maxMem)
	if err != nil {
		return usagef("--max-mem: %v", err)
	}
	specs := connector.ParseBackends(strings.Split(*backends, ","))
	if len(specs) == 0 {
		return usagef("--backends is empty")
	}
	if *timeout <= 0 || *xferTimeout <= 0 {
		return usagef("--timeout and --xfer-timeout must be positive")
	}
	if *serve {
		if *peer != "" {
			return usagef("--serve and --peer exclude each other")
		}
		lib, err := nf.load()
		if err != nil {
			return err
		}
		return benchServe(ctx, env, lib, serveConfig{listen: *listen, once: *once, maxMem: limit, backends: specs, timeout: *timeout})
	}

	cfg := benchConfig{iters: *iters, warmup: *warmup, pointTime: *pointTime, xferTimout: *xferTimeout, backends: specs}
	if cfg.ops, err = parseOps(*ops); err != nil {
		return err
	}
	if cfg.blocks, err = parseBlocks(*blockList, *minBlock, *maxBlock); err != nil {
		return err
	}
	if cfg.batches, err = parseInts(*batchList); err != nil {
		return usagef("--batch: %v", err)
	}
	if cfg.iters < 1 || cfg.warmup < 0 || cfg.pointTime <= 0 {
		return usagef("--iters must be at least 1, --warmup not negative, --point-time positive")
	}
	if m := cfg.memBytes(); m > limit {
		return usagef("the sweep needs %s per side (largest block × largest batch), more than --max-mem %s", humanBytes(m), humanBytes(limit))
	}
	switch *progress {
	case "on", "auto", "off":
	default:
		return usagef("--progress %q: want auto, on or off", *progress)
	}
	cfg.progress = progressPrinter(env.stderr, *progress)

	lib, err := nf.load()
	if err != nil {
		return err
	}
	rep := benchReport{Mode: "local", Backends: *backends}
	if *peer != "" {
		rep.Mode, rep.Peer = "remote", *peer
		err = benchPeer(ctx, lib, *peer, *timeout, cfg, &rep)
	} else {
		err = benchLocal(ctx, lib, cfg, &rep)
	}
	cfg.progress("", "")
	if err != nil {
		return err
	}
	return writeReport(env.stdout, *asJSON, rep, printBench)
}

func parseOps(s string) ([]nixl.Op, error) {
	var ops []nixl.Op
	for _, o := range strings.Split(s, ",") {
		switch strings.ToUpper(strings.TrimSpace(o)) {
		case "READ":
			ops = append(ops, nixl.Read)
		case "WRITE":
			ops = append(ops, nixl.Write)
		case "":
		default:
			return nil, usagef("--op %q: want READ, WRITE or READ,WRITE", o)
		}
	}
	if len(ops) == 0 {
		return nil, usagef("--op is empty")
	}
	return ops, nil
}

func parseBlocks(list, minS, maxS string) ([]int64, error) {
	var out []int64
	if list != "" {
		for _, s := range strings.Split(list, ",") {
			n, err := parseSize(s)
			if err != nil {
				return nil, usagef("--block-sizes: %v", err)
			}
			out = append(out, n)
		}
		return out, nil
	}
	lo, err := parseSize(minS)
	if err != nil {
		return nil, usagef("--min-block: %v", err)
	}
	hi, err := parseSize(maxS)
	if err != nil {
		return nil, usagef("--max-block: %v", err)
	}
	if lo > hi {
		return nil, usagef("--min-block %s is larger than --max-block %s", minS, maxS)
	}
	for b := lo; b <= hi; b *= 2 {
		out = append(out, b)
	}
	return out, nil
}

func parseInts(s string) ([]int, error) {
	var out []int
	for _, p := range strings.Split(s, ",") {
		var n int
		if _, err := fmt.Sscanf(strings.TrimSpace(p), "%d", &n); err != nil || n < 1 || n > 1<<20 {
			return nil, fmt.Errorf("bad count %q (want positive integers, comma-separated)", p)
		}
		out = append(out, n)
	}
	return out, nil
}

// progressPrinter returns the progress function: a line rewritten in place on a terminal, nothing when off.
// A new label is always shown; updates of the same label at most ten times a second. An empty label clears
// the line.
func progressPrinter(w io.Writer, mode string) func(label, detail string) {
	on := mode == "on"
	if mode == "auto" {
		if f, ok := w.(*os.File); ok {
			if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
				on = true
			}
		}
	}
	if !on {
		return func(string, string) {}
	}
	shown, lastLabel := false, ""
	last := time.Time{}
	return func(label, detail string) {
		if label == "" {
			if shown {
				fmt.Fprint(w, "\r\x1b[K")
				shown = false
			}
			return
		}
		if now := time.Now(); now.Sub(last) >= 100*time.Millisecond || label != lastLabel {
			last, lastLabel, shown = now, label, true
			fmt.Fprintf(w, "\r\x1b[K%s %s", label, detail)
		}
	}
}

// fillPattern writes the bench's verification pattern for seed (the same on both hosts).
func fillPattern(b []byte, seed uint64) {
	var w [8]byte
	for i := 0; i < len(b); i += 8 {
		x := seed + uint64(i)
		x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
		x = (x ^ (x >> 27)) * 0x94d049bb133111eb
		binary.LittleEndian.PutUint64(w[:], x^(x>>31))
		copy(b[i:], w[:])
	}
}

func checkPattern(b []byte, seed uint64) error {
	want := make([]byte, min(len(b), 1<<20))
	for off := 0; off < len(b); off += len(want) {
		n := min(len(want), len(b)-off)
		fillPattern(want[:n], seed+uint64(off))
		if i := firstDiff(b[off:off+n], want[:n]); i >= 0 {
			return fmt.Errorf("byte %d differs (got %#02x, want %#02x)", off+i, b[off+i], want[i])
		}
	}
	return nil
}

func firstDiff(a, b []byte) int {
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return -1
}

// benchLocal runs the sweep between two agents of this process.
func benchLocal(ctx context.Context, lib *nixl.Library, cfg benchConfig, rep *benchReport) error {
	size := cfg.memBytes()
	tgt, err := lib.NewAgent(throwawayAgentName("bench-target"), nixl.AgentConfig{Backends: cfg.backends})
	if err != nil {
		return fmt.Errorf("target agent: %w", err)
	}
	defer tgt.Close()
	tmem, err := nixl.AllocHost(size, nixl.HostOptions{})
	if err != nil {
		return err
	}
	defer tmem.Close()
	const seed = 0x6a09e667f3bcc908
	fillPattern(tmem.Bytes(), seed)
	treg, err := tgt.RegisterMem(nixl.DRAM, []nixl.Desc{tmem.Desc()})
	if err != nil {
		return fmt.Errorf("registering the target's memory: %w", err)
	}
	defer treg.Close()
	md, err := tgt.LocalMetadata()
	if err != nil {
		return err
	}
	return benchInitiator(ctx, lib, cfg, md, benchTarget{agent: tgt.Name(), addr: tmem.Addr(), len: uint64(size), seed: seed}, rep)
}

// benchInitiator creates the initiator agent and runs benchWithAgent.
func benchInitiator(ctx context.Context, lib *nixl.Library, cfg benchConfig, targetMD []byte, t benchTarget, rep *benchReport) error {
	ini, err := lib.NewAgent(throwawayAgentName("bench"), nixl.AgentConfig{Backends: cfg.backends})
	if err != nil {
		return fmt.Errorf("initiator agent: %w", err)
	}
	defer ini.Close()
	return benchWithAgent(ctx, ini, cfg, targetMD, t, rep)
}

// benchWithAgent registers the initiator's buffer, loads the target's metadata, verifies the data path and
// runs the sweep.
func benchWithAgent(ctx context.Context, ini *nixl.Agent, cfg benchConfig, targetMD []byte, t benchTarget, rep *benchReport) error {
	size := cfg.memBytes()
	if t.len < uint64(size) {
		return fmt.Errorf("the target's buffer (%d bytes) is smaller than the sweep needs (%d)", t.len, size)
	}
	mem, err := nixl.AllocHost(size, nixl.HostOptions{})
	if err != nil {
		return err
	}
	defer mem.Close()
	reg, err := ini.RegisterMem(nixl.DRAM, []nixl.Desc{mem.Desc()})
	if err != nil {
		return fmt.Errorf("registering the initiator's memory: %w", err)
	}
	defer reg.Close()
	name, err := ini.LoadRemoteMetadata(targetMD)
	if err != nil {
		return fmt.Errorf("loading the target's NIXL metadata: %w", err)
	}
	if name != t.agent {
		return fmt.Errorf("the target's metadata names agent %q, not %q", name, t.agent)
	}
	defer ini.InvalidateRemoteMetadata(name)
	rep.Initiator, rep.Target = ini.Name(), name
	b := &bencher{ctx: ctx, cfg: cfg, agent: ini, local: mem, target: t}
	if err := b.verify(size); err != nil {
		return err
	}
	rep.Verified = true
	for _, op := range cfg.ops {
		for _, batch := range cfg.batches {
			for _, bs := range cfg.blocks {
				row, err := b.point(op, bs, batch)
				if err != nil {
					return err
				}
				rep.Rows = append(rep.Rows, row)
			}
		}
	}
	return nil
}

type bencher struct {
	ctx    context.Context
	cfg    benchConfig
	agent  *nixl.Agent
	local  *nixl.HostMem
	target benchTarget
}

// descs returns batch descriptors of bs bytes, back to back from the start of each side's buffer.
func (b *bencher) descs(bs int64, batch int) (local, remote []nixl.Desc) {
	local = make([]nixl.Desc, batch)
	remote = make([]nixl.Desc, batch)
	for i := range local {
		off := uint64(i) * uint64(bs)
		local[i] = nixl.Desc{Addr: b.local.Addr() + off, Len: uint64(bs)}
		remote[i] = nixl.Desc{Addr: b.target.addr + off, Len: uint64(bs)}
	}
	return local, remote
}

// whole makes, posts and waits for one transfer over the whole buffer in chunks of at most 1 MiB.
func (b *bencher) whole(op nixl.Op, size int64) error {
	chunk := min(size, 1<<20)
	n := int((size + chunk - 1) / chunk)
	local := make([]nixl.Desc, 0, n)
	remote := make([]nixl.Desc, 0, n)
	for off := int64(0); off < size; off += chunk {
		l := uint64(min(chunk, size-off))
		local = append(local, nixl.Desc{Addr: b.local.Addr() + uint64(off), Len: l})
		remote = append(remote, nixl.Desc{Addr: b.target.addr + uint64(off), Len: l})
	}
	x, err := b.agent.CreateXfer(op, nixl.DRAM, local, nixl.DRAM, remote, b.target.agent)
	if err != nil {
		return fmt.Errorf("%s transfer request: %w", op, err)
	}
	defer x.Close()
	_, err = b.post(x)
	return err
}

// verify checks that READ brings the target's pattern and that WRITE then READ round-trips ours.
func (b *bencher) verify(size int64) error {
	buf := b.local.Bytes()[:size]
	clear(buf)
	if err := b.whole(nixl.Read, size); err != nil {
		return fmt.Errorf("verification READ: %w", err)
	}
	if err := checkPattern(buf, b.target.seed); err != nil {
		return fmt.Errorf("verification READ brought wrong data: %v", err)
	}
	const mine = 0xbb67ae8584caa73b
	fillPattern(buf, mine)
	if err := b.whole(nixl.Write, size); err != nil {
		return fmt.Errorf("verification WRITE: %w", err)
	}
	clear(buf)
	if err := b.whole(nixl.Read, size); err != nil {
		return fmt.Errorf("verification READ-back: %w", err)
	}
	if err := checkPattern(buf, mine); err != nil {
		return fmt.Errorf("verification WRITE did not land (read back): %v", err)
	}
	return nil
}

// post posts x and polls it to completion, returning how long that took.
func (b *bencher) post(x *nixl.Xfer) (time.Duration, error) {
	start := time.Now()
	st, err := x.Post()
	if err != nil {
		return 0, fmt.Errorf("posting a %s of %d descriptors to %s: %w", x.Op(), x.Len(), x.Remote(), err)
	}
	for polls := 0; st != nixl.Done; polls++ {
		if st, err = x.Status(); err != nil {
			return 0, fmt.Errorf("%s of %d descriptors to %s failed: %w", x.Op(), x.Len(), x.Remote(), err)
		}
		if polls&1023 == 1023 {
			if err := b.ctx.Err(); err != nil {
				return 0, err
			}
			if time.Since(start) > b.cfg.xferTimout {
				return 0, fmt.Errorf("%s of %d descriptors to %s did not complete within %v (is the peer alive?)", x.Op(), x.Len(), x.Remote(), b.cfg.xferTimout)
			}
			runtime.Gosched()
		}
	}
	return time.Since(start), nil
}

// point measures one (op, block size, batch) point.
func (b *bencher) point(op nixl.Op, bs int64, batch int) (benchRow, error) {
	row := benchRow{Op: op.String(), BlockSize: bs, Batch: batch, Bytes: bs * int64(batch)}
	local, remote := b.descs(bs, batch)
	x, err := b.agent.CreateXfer(op, nixl.DRAM, local, nixl.DRAM, remote, b.target.agent)
	if err != nil {
		return row, fmt.Errorf("%s transfer request (%s × %d): %w", op, formatSize(bs), batch, err)
	}
	defer x.Close()
	label := fmt.Sprintf("%-5s block %-7s batch %-5d", op, formatSize(bs), batch)
	for i := 0; i < b.cfg.warmup; i++ {
		b.cfg.progress(label, fmt.Sprintf("warm-up %d/%d", i+1, b.cfg.warmup))
		if _, err := b.post(x); err != nil {
			return row, err
		}
	}
	lat := make([]time.Duration, 0, b.cfg.iters)
	var total time.Duration
	start := time.Now()
	for i := 0; i < b.cfg.iters; i++ {
		if i >= 3 && time.Since(start) > b.cfg.pointTime {
			break
		}
		d, err := b.post(x)
		if err != nil {
			return row, err
		}
		lat = append(lat, d)
		total += d
		if total > 0 {
			b.cfg.progress(label, fmt.Sprintf("%d/%d  %.2f GB/s", i+1, b.cfg.iters, float64(row.Bytes)*float64(len(lat))/total.Seconds()/1e9))
		}
	}
	slices.Sort(lat)
	row.Iters = len(lat)
	us := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }
	row.AvgLatUs = us(total) / float64(len(lat))
	row.P99LatUs = us(lat[int(math.Ceil(0.99*float64(len(lat))))-1])
	row.MinLatUs = us(lat[0])
	if total > 0 {
		row.GBps = float64(row.Bytes) * float64(len(lat)) / total.Seconds() / 1e9
	}
	return row, nil
}

func printBench(w io.Writer, rep benchReport) {
	where := "two local agents"
	if rep.Mode == "remote" {
		where = "remote target " + rep.Peer
	}
	fmt.Fprintf(w, "# NIXL bench: %s (%s), %s → %s, data path verified: %v\n", where, rep.Backends, rep.Initiator, rep.Target, rep.Verified)
	fmt.Fprintf(w, "%-6s %12s %8s %8s %10s %14s %14s\n", "op", "block size", "batch", "iters", "GB/s", "avg lat (us)", "p99 lat (us)")
	for _, r := range rep.Rows {
		fmt.Fprintf(w, "%-6s %12s %8d %8d %10.3f %14.1f %14.1f\n", r.Op, formatSize(r.BlockSize), r.Batch, r.Iters, r.GBps, r.AvgLatUs, r.P99LatUs)
	}
}
