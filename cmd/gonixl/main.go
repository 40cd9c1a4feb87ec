package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/debug"
	"sort"
	"strings"
	"syscall"
)

// Exit statuses.
const (
	exitOK    = 0
	exitError = 1 // the command ran and failed (unreachable peer, bad bytes, hash mismatch, ...)
	exitUsage = 2 // bad command line
)

// command is one subcommand: its one-line summary, its argument synopsis and its body.
type command struct {
	name     string
	synopsis string // after "gonixl <name> "
	summary  string
	run      func(ctx context.Context, env *cmdEnv, args []string) error
}

// cmdEnv is what a command writes to.
type cmdEnv struct {
	stdout, stderr io.Writer
	name           string // the command's name, for messages
	cmd            *command
}

// commands is the command table, in help order.
var commands = []command{
	{"env", "[flags]", "where NIXL, CUDA and the Neuron runtime were found (or every place tried), and the side channel's ZMTP version", runEnv},
	{"probe", "tcp://HOST:PORT --vllm-version X [flags]", "run the decode side of the handshake against a live prefill worker and print what it advertises", runProbe},
	{"inspect", "FILE|- [flags]", "decode a captured NixlAgentMetadata, NixlHandshakePayload or kv_transfer_params and print it", runInspect},
	{"bench", "[flags]", "NIXL READ/WRITE throughput and latency over a sweep of descriptor sizes (local, or --serve / --peer)", runBench},
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := runContext(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run is main without the process: it parses args, runs one command and returns the exit status. Errors are
// printed as one line on stderr.
func run(args []string, stdout, stderr io.Writer) int {
	return runContext(context.Background(), args, stdout, stderr)
}

func runContext(ctx context.Context, args []string, stdout, stderr io.Writer) (code int) {
	if len(args) == 0 {
		usage(stderr)
		return exitUsage
	}
	name := args[0]
	switch name {
	case "help", "-h", "-help", "--help":
		if len(args) > 1 {
			if c := lookup(args[1]); c != nil {
				// `gonixl help probe` is `gonixl probe -h`.
				return runContext(ctx, []string{c.name, "-h"}, stdout, stderr)
			}
			fmt.Fprintf(stderr, "gonixl: unknown command %q; run `gonixl help` for the list\n", args[1])
			return exitUsage
		}
		usage(stdout)
		return exitOK
	case "version", "-version", "--version":
		fmt.Fprintln(stdout, versionString())
		return exitOK
	}
	c := lookup(name)
	if c == nil {
		fmt.Fprintf(stderr, "gonixl: unknown command %q; run `gonixl help` for the list\n", name)
		return exitUsage
	}
	env := &cmdEnv{stdout: stdout, stderr: stderr, name: c.name, cmd: c}
	defer func() {
		// A safety net: a bug must still end as one line, not a stack trace.
		if r := recover(); r != nil {
			fmt.Fprintf(stderr, "gonixl %s: internal error: %s (please report it with the command line)\n", c.name, oneLine(fmt.Sprint(r)))
			code = exitError
		}
	}()
	err := c.run(ctx, env, args[1:])
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, flag.ErrHelp):
		return exitOK
	}
	var ue *usageError
	if errors.As(err, &ue) {
		fmt.Fprintf(stderr, "gonixl %s: %s (see `gonixl %s -h`)\n", c.name, oneLine(ue.msg), c.name)
		return exitUsage
	}
	var qe *quietError
	if errors.As(err, &qe) {
		if qe.msg != "" {
			fmt.Fprintf(stderr, "gonixl %s: %s\n", c.name, oneLine(qe.msg))
		}
		return exitError
	}
	fmt.Fprintf(stderr, "gonixl %s: %s\n", c.name, oneLine(err.Error()))
	return exitError
}

func lookup(name string) *command {
	for i := range commands {
		if commands[i].name == name {
			return &commands[i]
		}
	}
	return nil
}

func usage(w io.Writer) {
	fmt.Fprintf(w, `gonixl is the operator tool of gonixl: inspect and test NIXL-based disaggregated serving
(vLLM NixlConnector wire protocol) from a shell.

Usage:
  gonixl <command> [arguments]

Commands:
`)
	for _, c := range commands {
		fmt.Fprintf(w, "  %-8s %s\n", c.name, c.summary)
	}
	fmt.Fprintf(w, `  %-8s %s
  %-8s %s

Run "gonixl <command> -h" (or "gonixl help <command>") for a command's flags.
Exit status: 0 success, 1 the command failed (one line on stderr says why), 2 bad command line.
`, "help", "this text", "version", "print gonixl's version")
}

func versionString() string {
	v := "(devel)"
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		v = bi.Main.Version
	}
	return "gonixl " + v
}

// usageError is a bad command line: printed with a pointer to -h, exit status 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, a ...any) error { return &usageError{msg: fmt.Sprintf(format, a...)} }

// quietError fails the command with exit status 1; its message (if any) is the one stderr line, without
// further decoration. Commands use it when the output was already printed and only the verdict remains.
type quietError struct{ msg string }

func (e *quietError) Error() string { return e.msg }

// oneLine folds a multi-line message (NIXL's LoadError lists one candidate per line) into one line.
func oneLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	out := lines[:0]
	for _, l := range lines {
		if l = strings.TrimSpace(l); l != "" {
			out = append(out, strings.TrimPrefix(l, "- "))
		}
	}
	return strings.Join(out, "; ")
}

// newFlagSet makes a command's flag set with the shared help format: synopsis, summary, then the flags.
func newFlagSet(env *cmdEnv, extra string) *flag.FlagSet {
	c := env.cmd
	fs := flag.NewFlagSet("gonixl "+env.name, flag.ContinueOnError)
	fs.SetOutput(io.Discard) // parse errors become one stderr line (usageError); -h prints to stdout
	fs.Usage = func() {
		w := env.stdout
		fmt.Fprintf(w, "Usage: gonixl %s %s\n\n%s.\n", c.name, c.synopsis, upperFirst(c.summary))
		if extra != "" {
			fmt.Fprintf(w, "\n%s\n", strings.TrimRight(extra, "\n"))
		}
		fmt.Fprintf(w, "\nFlags:\n")
		fs.SetOutput(w)
		fs.PrintDefaults()
		fs.SetOutput(io.Discard)
	}
	return fs
}

func upperFirst(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

// parseOne is parseArgs for a command that takes one positional argument, what (e.g. "FILE"); it returns it.
func parseOne(fs *flag.FlagSet, args []string, what string) (string, error) {
	pos, err := parseArgs(fs, args)
	if err != nil {
		return "", err
	}
	if len(pos) != 1 {
		return "", usagef("want exactly one %s, got %d arguments", what, len(pos))
	}
	return pos[0], nil
}

// parseNone is parseArgs for a command that takes flags only.
func parseNone(fs *flag.FlagSet, args []string) error {
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usagef("unexpected argument %q", pos[0])
	}
	return nil
}

// parseArgs parses flags that may come before or after the positional arguments ("probe tcp://h:p --json").
// -h prints the command's help and returns flag.ErrHelp.
func parseArgs(fs *flag.FlagSet, args []string) ([]string, error) {
	// The flag package calls Usage on every parse error too; print the help only for -h.
	help := fs.Usage
	fs.Usage = func() {}
	defer func() { fs.Usage = help }()
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				help()
				return nil, flag.ErrHelp
			}
			return nil, &usageError{msg: err.Error()}
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		if rest[0] == "--" {
			return append(pos, rest[1:]...), nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

// sortedKeys returns m's keys in order.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
