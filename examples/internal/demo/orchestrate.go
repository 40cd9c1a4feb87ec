package demo

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"
)

// OrchestratorMain is the whole main of an example that runs the workers as children of its own binary: it
// serves a worker when args name one (ServeSubcommand), else runs orchestrate; when that fails it prints
// "<name>: FAILED: <error>" and exits 1.
func OrchestratorMain(name string, args []string, orchestrate func() error) {
	if ServeSubcommand(args) {
		return
	}
	if err := orchestrate(); err != nil {
		fmt.Fprintln(os.Stderr, name+": FAILED:", err)
		os.Exit(1)
	}
}

// ParseLengths parses a -lengths flag: comma-separated prompt lengths in tokens, each positive. It returns
// them and the longest.
func ParseLengths(s string) (sizes []int, longest int, err error) {
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			return nil, 0, fmt.Errorf("bad -lengths entry %q", f)
		}
		sizes = append(sizes, n)
		longest = max(longest, n)
	}
	return sizes, longest, nil
}

// RunContext is the context of a whole run: it ends after timeout, or at SIGINT or SIGTERM.
func RunContext(timeout time.Duration) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	return ctx, func() { stop(); cancel() }
}

// WorkerArgs are the shared flags as the workers take them (the orchestrating examples pass theirs on).
func (c *Common) WorkerArgs() []string {
	args := []string{"-vllm-version", c.VLLMVersion, "-num-blocks", strconv.Itoa(c.NumBlocks), "-kv-layout", c.Order,
		"-backends", c.Backends, "-log-level", c.LogLevel}
	if c.NIXLLibDir != "" {
		args = append(args, "-nixl-lib-dir", c.NIXLLibDir)
	}
	if c.DataDevice != "" {
		args = append(args, "-data-device", c.DataDevice)
	}
	return args
}

// RunRequests runs request(i) for every i in [0, n), at most concurrency at once, and prints each one's
// progress line as it completes: "  [done/n] <line>". It returns how long they took together.
func RunRequests(n, concurrency int, request func(i int) (line string)) time.Duration {
	start := time.Now()
	sem := make(chan struct{}, concurrency)
	var wg sync.WaitGroup
	var mu sync.Mutex
	done := 0
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			line := request(i)
			mu.Lock()
			defer mu.Unlock()
			done++
			fmt.Printf("  [%d/%d] %s\n", done, n, line)
		}()
	}
	wg.Wait()
	return time.Since(start)
}

// DescribeModel is how the examples name the model's KV cache, e.g. "Qwen/Qwen3-0.6B KV cache (28 layers × 8
// KV heads × 128, bf16, block 16)".
func DescribeModel() string {
	m := Qwen3_0_6B
	return fmt.Sprintf("%s KV cache (%d layers × %d KV heads × %d, bf16, block %d)", m.Name, m.Layers, m.KVHeads, m.HeadDim, m.BlockSize)
}

// Table is the summary the orchestrating examples print after their requests: a header, a row per request
// (a failed request's row is dashes and FAILED), right-aligned.
type Table struct {
	tw     *tabwriter.Writer
	cols   int
	Failed int // the requests that failed or were not verified
}

// NewTable prints a blank line and starts a table with the columns; the first two are the request's name
// and its prompt's tokens, the last whether it was verified.
func NewTable(columns ...string) *Table {
	fmt.Println()
	t := &Table{tw: tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight), cols: len(columns)}
	fmt.Fprintln(t.tw, strings.Join(columns, "\t")+"\t")
	return t
}

// Row adds a row: format has a verb per column, tab-separated.
func (t *Table) Row(format string, a ...any) { fmt.Fprintf(t.tw, format+"\t\n", a...) }

// Fail adds the row of a request that failed and counts it.
func (t *Table) Fail(name string, tokens int) {
	t.Failed++
	fmt.Fprintf(t.tw, "%s\t%d\t%sFAILED\t\n", name, tokens, strings.Repeat("-\t", max(t.cols-3, 0)))
}

// Flush prints the table.
func (t *Table) Flush() { t.tw.Flush() }

// Err is the run's error when a request failed or was not verified.
func (t *Table) Err() error {
	if t.Failed > 0 {
		return errors.New(strconv.Itoa(t.Failed) + " request(s) failed or were not verified")
	}
	return nil
}
