package demo

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// Proc is a child process of an orchestrating example (a worker, or one of Dynamo's servers). A READY line on
// its stdout, when the program prints one, is sent to WaitReady. With a log file, its stdout and stderr go
// there (read only after it exited, or for reports); without one, its stderr is the parent's and its other
// stdout lines are dropped.
type Proc struct {
	Name  string
	Log   string // the log file ("" = none)
	cmd   *exec.Cmd
	ready chan string
	done  chan struct{}
	err   error // set before done closes
}

// StartProc starts argv with env (nil = the parent's environment).
func StartProc(name, logPath string, env []string, argv ...string) (*Proc, error) {
	var log io.WriteCloser
	if logPath != "" {
		f, err := os.Create(logPath)
		if err != nil {
			return nil, err
		}
		log = f
	}
	closeLog := func() {
		if log != nil {
			log.Close()
		}
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = env
	cmd.Stderr = os.Stderr
	if log != nil {
		cmd.Stderr = log
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		closeLog()
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		closeLog()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &Proc{Name: name, Log: logPath, cmd: cmd, ready: make(chan string, 1), done: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			line := sc.Text()
			if rest, ok := strings.CutPrefix(line, "READY "); ok {
				select {
				case p.ready <- rest:
				default:
				}
			}
			if log != nil {
				fmt.Fprintln(log, line)
			}
		}
		// A line longer than the scanner's buffer stops Scan: keep draining, so the child never blocks
		// writing to a pipe nobody reads.
		_, _ = io.Copy(io.Discard, out)
		p.err = cmd.Wait() // after every read from the pipe
		closeLog()
		close(p.done)
	}()
	return p, nil
}

// WaitReady returns the READY line's rest, or an error when the process exits first or ctx ends.
func (p *Proc) WaitReady(ctx context.Context) (string, error) {
	select {
	case line := <-p.ready:
		return line, nil
	case <-p.done:
		return "", fmt.Errorf("%s exited before it was ready (%v)%s", p.Name, p.err, p.logTail())
	case <-ctx.Done():
		return "", fmt.Errorf("%s not ready: %w%s", p.Name, ctx.Err(), p.logTail())
	}
}

// Done is closed once the process has exited.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Err is how the process ended (read it after Done is closed).
func (p *Proc) Err() error {
	<-p.done
	return p.err
}

// Exited reports whether the process has exited.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Stop sends SIGTERM and waits up to grace for the exit, then kills. It reports how long the exit took.
func (p *Proc) Stop(grace time.Duration) time.Duration {
	t := time.Now()
	if p.Exited() {
		return 0
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
	return time.Since(t)
}

// Signal sends sig (e.g. SIGSTOP, SIGCONT, SIGKILL).
func (p *Proc) Signal(sig syscall.Signal) error { return p.cmd.Process.Signal(sig) }

// Tail returns the last lines of the log (only while the process writes nothing else, or after it exited:
// it reads the file, never a buffer the process writes into).
func (p *Proc) Tail() string {
	if p.Log == "" {
		return ""
	}
	data, _ := os.ReadFile(p.Log)
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > 15 {
		lines = lines[len(lines)-15:]
	}
	return "\n\t" + strings.Join(lines, "\n\t")
}

// logTail is "; its log: <Tail>", or nothing without a log file.
func (p *Proc) logTail() string {
	if p.Log == "" {
		return ""
	}
	return "; its log: " + p.Tail()
}

// StartWorker starts self's serve-<role> ("prefill" or "decode") on a free loopback HTTP port with args and
// waits until it is ready. It returns the worker, its base URL and the rest of its READY line; on error it
// stops what it started.
func StartWorker(ctx context.Context, w WorkerSpec) (*Proc, string, string, error) {
	p, err := w.Start()
	if err != nil {
		return nil, "", "", err
	}
	url, info, err := w.Ready(ctx, p)
	if err != nil {
		p.Stop(10 * time.Second)
		return nil, "", "", err
	}
	return p, url, info, nil
}

// WorkerSpec says how to run one of the example's own workers: this program re-executed as serve-<Role>.
type WorkerSpec struct {
	Name string   // e.g. "prefill worker"
	Self string   // the binary ("" = this program)
	Role string   // "prefill" or "decode"
	Args []string // its flags (-http 127.0.0.1:0 comes first)
	Log  string   // log file ("" = none: stderr is the parent's)
	Env  []string // nil = the parent's
	Wrap []string // a command the worker runs under, e.g. ip netns exec NS (nil = none)
}

// Start starts the worker.
func (w WorkerSpec) Start() (*Proc, error) {
	self := w.Self
	if self == "" {
		var err error
		if self, err = os.Executable(); err != nil {
			return nil, err
		}
	}
	argv := append(append(append([]string(nil), w.Wrap...), self, "serve-"+w.Role, "-http", "127.0.0.1:0"), w.Args...)
	return StartProc(w.Name, w.Log, w.Env, argv...)
}

// Ready waits for p's READY line and splits it into the base URL and the rest.
func (w WorkerSpec) Ready(ctx context.Context, p *Proc) (url, info string, err error) {
	line, err := p.WaitReady(ctx)
	if err != nil {
		return "", "", err
	}
	f := strings.Fields(line)
	if len(f) == 0 {
		return "", "", fmt.Errorf("%s: empty READY line", w.Name)
	}
	return f[0], strings.Join(f[1:], " "), nil
}
