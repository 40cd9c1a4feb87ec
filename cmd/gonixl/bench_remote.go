package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net"
	"time"

	"github.com/gonixl/gonixl/nixl"
)

// The remote bench's control connection: one JSON object per line over plain TCP.
//
//	initiator → target  benchHello   {"gonixl_bench": 1, "bytes": N, "agent": name, "metadata": <base64>}
//	target → initiator  benchWelcome {"gonixl_bench": 1, "agent": name, "metadata": <base64>, "addr": A, "len": N, "seed": S}
//	                                 or {"gonixl_bench": 1, "error": "..."}
//	initiator → target  benchBye     {"done": true} (or the connection closes)
//
// The target registers N bytes filled with the pattern of seed S and keeps them until the initiator is done.
// The transfers themselves go over NIXL.
const benchProtoVersion = 1

// maxControlLine bounds one control line (NIXL metadata is a few KiB per backend).
const maxControlLine = 16 << 20

type benchHello struct {
	Version  int    `json:"gonixl_bench"`
	Bytes    int64  `json:"bytes"`
	Agent    string `json:"agent"`
	Metadata []byte `json:"metadata"`
}

type benchWelcome struct {
	Version  int    `json:"gonixl_bench"`
	Agent    string `json:"agent,omitempty"`
	Metadata []byte `json:"metadata,omitempty"`
	Addr     uint64 `json:"addr,omitempty"`
	Len      uint64 `json:"len,omitempty"`
	Seed     uint64 `json:"seed,omitempty"`
	Error    string `json:"error,omitempty"`
}

// check validates a hello (network input) before anything is allocated for it.
func (h benchHello) check(maxMem int64) error {
	switch {
	case h.Version != benchProtoVersion:
		return fmt.Errorf("protocol version %d, this server speaks %d (use the same gonixl on both hosts)", h.Version, benchProtoVersion)
	case h.Bytes <= 0 || h.Bytes > maxMem:
		return fmt.Errorf("asked for %d bytes; this server allows 1..%d (--max-mem)", h.Bytes, maxMem)
	case h.Agent == "" || len(h.Agent) > 4096:
		return errors.New("no (or an absurd) initiator agent name in the hello")
	case len(h.Metadata) == 0:
		return errors.New("no NIXL metadata in the hello")
	}
	return nil
}

// check validates a welcome (network input) for a sweep that needs size bytes.
func (w benchWelcome) check(size int64) error {
	switch {
	case w.Error != "":
		return fmt.Errorf("the bench server refused: %s", w.Error)
	case w.Version != benchProtoVersion:
		return fmt.Errorf("the bench server speaks protocol %d, this gonixl %d; use the same gonixl on both hosts", w.Version, benchProtoVersion)
	case w.Agent == "" || len(w.Metadata) == 0 || w.Addr == 0:
		return errors.New("incomplete welcome (no agent, metadata or buffer address)")
	case w.Len < uint64(size) || w.Addr > math.MaxUint64-w.Len:
		return fmt.Errorf("the server's buffer (%d bytes at %#x) cannot hold the sweep's %d bytes", w.Len, w.Addr, size)
	}
	return nil
}

type benchBye struct {
	Done bool `json:"done"`
}

type serveConfig struct {
	listen   string
	once     bool
	maxMem   int64
	backends []nixl.BackendSpec
	timeout  time.Duration
}

// readLine reads one JSON line into v.
func readLine(r *bufio.Reader, v any) error {
	var line []byte
	for {
		chunk, isPrefix, err := r.ReadLine()
		if err != nil {
			return err
		}
		line = append(line, chunk...)
		if len(line) > maxControlLine {
			return fmt.Errorf("control line longer than %d bytes", maxControlLine)
		}
		if !isPrefix {
			break
		}
	}
	if err := json.Unmarshal(line, v); err != nil {
		return fmt.Errorf("not a gonixl bench message: %v", err)
	}
	return nil
}

func writeLine(c net.Conn, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = c.Write(append(b, '\n'))
	return err
}

// benchServe is `gonixl bench --serve`: a target agent that serves initiators one after another.
func benchServe(ctx context.Context, env *cmdEnv, lib *nixl.Library, cfg serveConfig) error {
	agent, err := lib.NewAgent(throwawayAgentName("bench-serve"), nixl.AgentConfig{Backends: cfg.backends})
	if err != nil {
		return fmt.Errorf("target agent: %w", err)
	}
	defer agent.Close()
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", cfg.listen)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", cfg.listen, err)
	}
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	defer ln.Close()
	fmt.Fprintf(env.stdout, "gonixl bench: serving on %s (NIXL agent %s); stop with Ctrl-C\n", ln.Addr(), agent.Name())
	seq := uint64(0)
	for {
		conn, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil // stopped (signal or cancellation)
			}
			return fmt.Errorf("accepting on %s: %w", ln.Addr(), err)
		}
		seq++
		err = serveOne(ctx, agent, conn, cfg, seq)
		who := conn.RemoteAddr().String()
		conn.Close()
		if err != nil && ctx.Err() == nil {
			// One bad initiator does not stop the server; say what happened and go on.
			fmt.Fprintf(env.stderr, "gonixl bench: initiator %s: %s\n", who, oneLine(err.Error()))
		} else if err == nil {
			fmt.Fprintf(env.stdout, "gonixl bench: initiator %s done\n", who)
		}
		if ctx.Err() != nil {
			return nil
		}
		if cfg.once {
			return err
		}
	}
}

func serveOne(ctx context.Context, agent *nixl.Agent, conn net.Conn, cfg serveConfig, seq uint64) error {
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	r := bufio.NewReaderSize(conn, 64<<10)
	_ = conn.SetDeadline(time.Now().Add(cfg.timeout))
	var hello benchHello
	if err := readLine(r, &hello); err != nil {
		return fmt.Errorf("reading the hello: %w", err)
	}
	refuse := func(format string, a ...any) error {
		msg := fmt.Sprintf(format, a...)
		_ = writeLine(conn, benchWelcome{Version: benchProtoVersion, Error: msg})
		return errors.New(msg)
	}
	if err := hello.check(cfg.maxMem); err != nil {
		return refuse("%v", err)
	}
	mem, err := nixl.AllocHost(hello.Bytes, nixl.HostOptions{})
	if err != nil {
		return refuse("allocating %d bytes: %v", hello.Bytes, err)
	}
	defer mem.Close()
	seed := 0x3c6ef372fe94f82b + seq
	fillPattern(mem.Bytes(), seed)
	reg, err := agent.RegisterMem(nixl.DRAM, []nixl.Desc{mem.Desc()})
	if err != nil {
		return refuse("registering %d bytes: %v", hello.Bytes, err)
	}
	defer reg.Close()
	name, err := agent.LoadRemoteMetadata(hello.Metadata)
	if err != nil {
		return refuse("loading the initiator's NIXL metadata: %v", err)
	}
	defer agent.InvalidateRemoteMetadata(name)
	if name != hello.Agent {
		return refuse("the initiator's metadata names agent %q, the hello %q", name, hello.Agent)
	}
	md, err := agent.LocalMetadata()
	if err != nil {
		return refuse("local metadata: %v", err)
	}
	if err := writeLine(conn, benchWelcome{Version: benchProtoVersion, Agent: agent.Name(), Metadata: md,
		Addr: mem.Addr(), Len: uint64(mem.Len()), Seed: seed}); err != nil {
		return err
	}
	// The initiator benches now; wait (without a deadline: sweeps can be long) for its goodbye or its close.
	_ = conn.SetDeadline(time.Time{})
	var bye benchBye
	if err := readLine(r, &bye); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return nil // the initiator closed the connection: done as well
	}
	return nil
}

// benchPeer runs the sweep against a remote `gonixl bench --serve`.
func benchPeer(ctx context.Context, lib *nixl.Library, addr string, timeout time.Duration, cfg benchConfig, rep *benchReport) error {
	d := net.Dialer{Timeout: timeout}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("connecting to the bench server: %w (is `gonixl bench --serve` running there, listening on a reachable address?)", err)
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()

	size := cfg.memBytes()
	// The initiator agent is made by benchInitiator; the server needs its metadata first, so make the agent
	// here and hand it over.
	ini, err := lib.NewAgent(throwawayAgentName("bench"), nixl.AgentConfig{Backends: cfg.backends})
	if err != nil {
		return fmt.Errorf("initiator agent: %w", err)
	}
	defer ini.Close()
	md, err := ini.LocalMetadata()
	if err != nil {
		return err
	}
	_ = conn.SetDeadline(time.Now().Add(timeout))
	if err := writeLine(conn, benchHello{Version: benchProtoVersion, Bytes: size, Agent: ini.Name(), Metadata: md}); err != nil {
		return fmt.Errorf("sending the hello to %s: %w", addr, err)
	}
	var w benchWelcome
	if err := readLine(bufio.NewReaderSize(conn, 64<<10), &w); err != nil {
		return fmt.Errorf("no welcome from %s: %w (is it a `gonixl bench --serve`?)", addr, err)
	}
	if err := w.check(size); err != nil {
		return fmt.Errorf("%s: %w", addr, err)
	}
	_ = conn.SetDeadline(time.Time{})
	err = benchWithAgent(ctx, ini, cfg, w.Metadata, benchTarget{agent: w.Agent, addr: w.Addr, len: w.Len, seed: w.Seed}, rep)
	_ = conn.SetDeadline(time.Now().Add(timeout))
	_ = writeLine(conn, benchBye{Done: true})
	return err
}
