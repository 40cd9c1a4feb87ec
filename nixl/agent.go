package nixl

import (
	"fmt"
	"runtime"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/gonixl/gonixl/internal/lifetime"
)

// ThreadSync is NIXL's agent locking mode.
type ThreadSync int

// Locking modes. SyncDefault (the zero value) selects SyncRW, which lets goroutines share an agent.
const (
	SyncDefault ThreadSync = iota
	SyncNone               // no locking: only one goroutine may use the agent
	SyncStrict             // one mutex serializes every agent call
	SyncRW                 // transfer calls share a lock; registration and metadata changes take it exclusively
)

// AgentConfig configures NewAgent. The zero value is a good default for Go programs: progress thread on,
// RW locking, no telemetry, no backends (create them with CreateBackend or list them in Backends).
type AgentConfig struct {
	// NoProgressThread turns NIXL's progress thread off; then the application must drive progress by
	// polling (GetNotifications, Xfer.Status) on both sides. An agent that is mostly the target of peers'
	// transfers and must see their notifications should do this: with NIXL 1.5.1 (nixl-cu12 wheel, UCX over
	// TCP) the progress thread occasionally never delivers a notification that arrives from another process
	// (seen in about one run in five of this package's two-process test; none in 48 runs with the target
	// polling instead), and a target that polls GetNotifications every few tens of microseconds also serves
	// TCP reads faster than one whose progress thread competes for the CPU.
	NoProgressThread bool
	// ProgressDelay bounds how long the progress thread sleeps when no event wakes it (0 =
	// DefaultProgressDelay). NIXL's own default, 0, makes the thread poll without sleeping: a busy core per
	// agent.
	ProgressDelay time.Duration
	// Sync selects NIXL's locking mode.
	Sync ThreadSync
	// CaptureTelemetry makes Xfer.Telemetry work.
	CaptureTelemetry bool
	// Backends are created, in order (the order is NIXL's preference order), by NewAgent.
	Backends []BackendSpec
	// Logger receives the agent's diagnostics (leaks, closes); nil means no logging.
	Logger *zap.Logger
}

// DefaultProgressDelay is the progress thread's poll timeout when AgentConfig.ProgressDelay is 0. The thread
// also wakes on every UCX event, so this bounds only how late it notices work that raised no event. (NIXL
// rounds it up to whole milliseconds.)
const DefaultProgressDelay = time.Millisecond

// BackendSpec names a NIXL plugin ("UCX", "LIBFABRIC", "POSIX", ...) and its init parameters.
type BackendSpec struct {
	Plugin string
	Params map[string]string
}

// Agent is a NIXL agent. Its methods are safe for concurrent use by several goroutines (NIXL runs in RW
// locking mode unless AgentConfig.Sync says otherwise). Close releases every child handle still open
// (transfer requests first, then prepared descriptor lists, then registrations) and then the agent:
// children closed by the agent's Close report ErrClosed afterwards, and their own Close is a no-op.
type Agent struct {
	name string
	lib  *Library
	log  *zap.Logger

	mu       sync.RWMutex // RLock: native calls; Lock: Close
	h        agentHandle
	closed   bool
	closedAt *atomic.Bool // shared with the leak cleanup

	childMu  sync.Mutex
	children map[uint64]*child
	nextID   atomic.Uint64

	backendMu sync.Mutex
	backends  []*Backend

	notifMu  sync.Mutex
	notifMap notifMapHandle
}

type childKind int

const (
	kindXfer         childKind = iota // transfer request
	kindPrepped                       // prepared descriptor list
	kindRegistration                  // memory registration
)

// child is the native side of a handle owned by the agent: one of xfer, prepped and reg, by kind. It holds no
// reference to the Go wrapper, so a wrapper that is dropped without Close can be collected, and its cleanup
// reports the leak.
type child struct {
	kind    childKind
	xfer    xferHandle    // kindXfer
	prepped preppedHandle // kindPrepped
	reg     regList       // kindRegistration
	desc    string
}

// NewAgent creates a NIXL agent. The name must be non-empty and unique among the agents that exchange
// metadata.
func (l *Library) NewAgent(name string, cfg AgentConfig) (*Agent, error) {
	if l == nil {
		return nil, goErr("create agent", ErrNotLoaded, "nil Library: call nixl.Load first")
	}
	if name == "" || strings.IndexByte(name, 0) >= 0 {
		return nil, goErr("create agent", ErrInvalidParam, "agent name must be non-empty and contain no NUL byte")
	}
	log := cfg.Logger
	if log == nil {
		log = zap.NewNop()
	}
	h, st := cCreateAgent(name, agentConfig{progressThread: !cfg.NoProgressThread, threadSync: cfg.Sync,
		progressDelay: progressDelay(cfg.ProgressDelay), captureTelemetry: cfg.CaptureTelemetry})
	if err := check("create agent", st, "agent "+name); err != nil {
		return nil, err
	}
	a := &Agent{name: name, lib: l, log: log.With(zap.String("nixl_agent", name)), h: h, children: map[uint64]*child{}, closedAt: new(atomic.Bool)}
	runtime.AddCleanup(a, func(closed *atomic.Bool) {
		if !closed.Load() {
			reportLeak(Leak{Kind: "agent", Agent: name, What: "agent dropped without Close"})
		}
	}, a.closedAt)
	for _, spec := range cfg.Backends {
		if _, err := a.CreateBackend(spec.Plugin, spec.Params); err != nil {
			a.Close()
			return nil, err
		}
	}
	return a, nil
}

// Name returns the agent's name.
func (a *Agent) Name() string { return a.name }

// Library returns the library the agent runs on.
func (a *Agent) Library() *Library { return a.lib }

// use takes the agent's read lock for one native call sequence; the returned func releases it.
func (a *Agent) use(op string) (func(), error) {
	a.mu.RLock()
	if a.closed {
		a.mu.RUnlock()
		return nil, goErr(op, ErrClosed, "agent %s is closed", a.name)
	}
	return a.mu.RUnlock, nil
}

// useOpts is use plus the call's options converted for C (nil when there are none); end releases both.
func (a *Agent) useOpts(op string, opts []Option) (o optHandle, end func(), err error) {
	done, err := a.use(op)
	if err != nil {
		return nil, nil, err
	}
	if o, err = buildOpts(op, opts); err != nil {
		done()
		return nil, nil, err
	}
	return o, func() { freeOpts(o); done() }, nil
}

// Close releases every child handle still open, then destroys the agent. It is idempotent.
func (a *Agent) Close() error { return lifetime.CloseOnce(&a.mu, &a.closed, a.teardown) }

// teardown is Close's work, run once with a.mu locked.
func (a *Agent) teardown() error {
	a.closedAt.Store(true)
	var firstErr error
	a.childMu.Lock()
	kids := make([]*child, 0, len(a.children))
	for _, c := range a.children {
		kids = append(kids, c)
	}
	a.children = map[uint64]*child{}
	a.childMu.Unlock()
	sort.SliceStable(kids, func(i, j int) bool { return kids[i].kind < kids[j].kind })
	for _, c := range kids {
		a.log.Debug("closing child with its agent", zap.String("kind", c.kind.String()), zap.String("what", c.desc))
		if err := a.releaseChild(c); err != nil && firstErr == nil {
			firstErr = err
		}
	}
	a.backendMu.Lock()
	for _, b := range a.backends {
		cDestroyBackend(b.h)
		b.h = nil
	}
	a.backends = nil
	a.backendMu.Unlock()
	if a.notifMap != nil {
		cDestroyNotifMap(a.notifMap)
		a.notifMap = nil
	}
	if err := check("destroy agent", cDestroyAgent(a.h), a.name); err != nil && firstErr == nil {
		firstErr = err
	}
	a.h = nil
	runtime.KeepAlive(a)
	return firstErr
}

// releaseChild frees a child's native handle; the caller holds a.mu (read or write).
func (a *Agent) releaseChild(c *child) error {
	switch c.kind {
	case kindXfer:
		return check("release transfer request", cReleaseXfer(a.h, c.xfer), c.desc)
	case kindPrepped:
		return check("release prepared descriptor list", cReleasePrepped(a.h, c.prepped), c.desc)
	case kindRegistration:
		err := check("deregister memory", cDeregisterMem(a.h, c.reg), c.desc)
		cDestroyRegList(c.reg)
		return err
	}
	return nil
}

func (a *Agent) addChild(c *child) uint64 {
	id := a.nextID.Add(1)
	a.childMu.Lock()
	a.children[id] = c
	a.childMu.Unlock()
	return id
}

// closeChild releases child id if the agent still owns it. It is idempotent.
func (a *Agent) closeChild(id uint64, op string) error {
	a.mu.RLock()
	defer a.mu.RUnlock()
	if a.closed {
		return nil // the agent's Close released it
	}
	a.childMu.Lock()
	c, ok := a.children[id]
	a.childMu.Unlock()
	if !ok {
		return nil
	}
	if err := a.releaseChild(c); err != nil {
		return err // still owned: a later Close (or the agent's) retries
	}
	a.childMu.Lock()
	delete(a.children, id)
	a.childMu.Unlock()
	return nil
}

// child returns child id, or an ErrClosed error.
func (a *Agent) child(id uint64, op string) (*child, error) {
	a.childMu.Lock()
	c, ok := a.children[id]
	a.childMu.Unlock()
	if !ok {
		return nil, goErr(op, ErrClosed, "handle already closed")
	}
	return c, nil
}

type childRef struct {
	a  *Agent
	id uint64
}

// leaked is the cleanup of a child wrapper that became unreachable without Close.
func (r childRef) leaked() {
	r.a.childMu.Lock()
	c, ok := r.a.children[r.id]
	r.a.childMu.Unlock()
	if !ok {
		return
	}
	reportLeak(Leak{Kind: c.kind.String(), Agent: r.a.name, What: c.desc})
	r.a.log.Warn("NIXL handle leaked (dropped without Close); releasing it", zap.String("kind", c.kind.String()), zap.String("what", c.desc))
	_ = r.a.closeChild(r.id, "release leaked handle")
}

// Leak describes a handle that was garbage-collected without Close.
type Leak struct {
	Kind  string // "agent", "transfer request", "prepared descriptor list", "memory registration", "host memory"
	Agent string
	What  string
}

var leakHandler atomic.Pointer[func(Leak)]

// OnLeak installs a function called (from a cleanup goroutine) for every handle that was dropped without
// Close; tests use it to fail on leaks. Pass nil to remove it.
func OnLeak(f func(Leak)) {
	if f == nil {
		leakHandler.Store(nil)
		return
	}
	leakHandler.Store(&f)
}

func reportLeak(l Leak) {
	if f := leakHandler.Load(); f != nil {
		(*f)(l)
	}
}

// Backend is a NIXL backend (an instantiated plugin) of an agent. It is owned by its agent and valid until
// the agent is closed.
type Backend struct {
	agent  *Agent
	plugin string
	h      backendHandle
}

// Plugin returns the plugin name ("UCX", ...).
func (b *Backend) Plugin() string { return b.plugin }

// CreateBackend instantiates plugin with params (nil = the plugin's defaults, see PluginParams). At most
// one backend per plugin per agent.
func (a *Agent) CreateBackend(plugin string, params map[string]string) (*Backend, error) {
	op := "create backend " + plugin
	done, err := a.use(op)
	if err != nil {
		return nil, err
	}
	defer done()
	p, st := cCreateParams()
	if err := check(op, st, ""); err != nil {
		return nil, err
	}
	defer cDestroyParams(p)
	keys := make([]string, 0, len(params))
	for k := range params {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if err := check(op, cParamsAdd(p, k, params[k]), "param "+k); err != nil {
			return nil, err
		}
	}
	h, st := cCreateBackend(a.h, plugin, p)
	if err := check(op, st, fmt.Sprintf(
		"agent %s; check the plugin name (AvailablePlugins), its params (PluginParams) and that no %s backend exists yet", a.name, plugin)); err != nil {
		return nil, err
	}
	b := &Backend{agent: a, plugin: plugin, h: h}
	a.backendMu.Lock()
	a.backends = append(a.backends, b)
	a.backendMu.Unlock()
	return b, nil
}

// Backend returns the agent's backend of the plugin, or nil.
func (a *Agent) Backend(plugin string) *Backend {
	a.backendMu.Lock()
	defer a.backendMu.Unlock()
	for _, b := range a.backends {
		if b.plugin == plugin {
			return b
		}
	}
	return nil
}

// Backends returns the agent's backends in creation (preference) order.
func (a *Agent) Backends() []*Backend {
	a.backendMu.Lock()
	defer a.backendMu.Unlock()
	return append([]*Backend(nil), a.backends...)
}

// AvailablePlugins lists the plugins NIXL found in its plugin folder.
func (a *Agent) AvailablePlugins() ([]string, error) {
	done, err := a.use("list plugins")
	if err != nil {
		return nil, err
	}
	defer done()
	s, st := cPlugins(a.h)
	if err := check("list plugins", st, ""); err != nil {
		return nil, err
	}
	return strings.Fields(s), nil
}

// PluginParams returns the memory types a plugin supports and its default init parameters.
func (a *Agent) PluginParams(plugin string) ([]MemType, map[string]string, error) {
	op := "plugin params " + plugin
	done, err := a.use(op)
	if err != nil {
		return nil, nil, err
	}
	defer done()
	mems, params, st := cPluginParams(a.h, plugin)
	if err := check(op, st, "is the plugin in AvailablePlugins?"); err != nil {
		return nil, nil, err
	}
	return mems, params, nil
}

// Params returns the memory types the backend serves and its effective parameters.
func (b *Backend) Params() ([]MemType, map[string]string, error) {
	op := "backend params " + b.plugin
	done, err := b.agent.use(op)
	if err != nil {
		return nil, nil, err
	}
	defer done()
	mems, params, st := cBackendParams(b.agent.h, b.h)
	if err := check(op, st, ""); err != nil {
		return nil, nil, err
	}
	return mems, params, nil
}

// Option adjusts one call (backends to use, a notification to send).
type Option func(*callOpts)

type callOpts struct {
	backends []*Backend
	notif    []byte
	hasNotif bool
	custom   []byte
	noMerge  bool
}

// WithBackends restricts the call to these backends (default: every backend that can serve it).
func WithBackends(b ...*Backend) Option {
	return func(o *callOpts) { o.backends = append(o.backends, b...) }
}

// WithNotification attaches a notification to a transfer: NIXL delivers msg (arbitrary bytes, NULs
// allowed; empty is still sent) to the remote agent once the transfer is complete.
func WithNotification(msg []byte) Option {
	return func(o *callOpts) { o.notif = msg; o.hasNotif = true }
}

// WithCustomParam passes a backend-specific blob (only with NIXL versions whose C API has it; see
// Library.HasCustomParams).
func WithCustomParam(p []byte) Option {
	return func(o *callOpts) { o.custom = p }
}

// WithoutDescMerge asks MakeXfer not to merge descriptors (NIXL merges a run of consecutive indices whose
// descriptors are adjacent in memory on both sides into one; this turns that off, e.g. to count the
// descriptors a request would post without the merge). Only with NIXL versions whose C API has it (see
// Library.HasSkipDescMerge); others refuse the call with ErrInvalidParam.
func WithoutDescMerge() Option {
	return func(o *callOpts) { o.noMerge = true }
}

// buildOpts makes the C optional-args object (nil when no option is set); free it with freeOpts.
func buildOpts(op string, opts []Option) (optHandle, error) {
	if len(opts) == 0 {
		return nil, nil
	}
	var o callOpts
	for _, f := range opts {
		f(&o)
	}
	var bs []backendHandle
	for _, b := range o.backends {
		if b == nil || b.h == nil {
			return nil, goErr(op, ErrInvalidParam, "nil or closed backend in WithBackends")
		}
		bs = append(bs, b.h)
	}
	h, st := cBuildOpt(bs, o.notif, o.hasNotif, o.custom, o.noMerge)
	if err := check(op, st, "building call options (WithCustomParam / WithoutDescMerge need a NIXL whose C API has them)"); err != nil {
		return nil, err
	}
	return h, nil
}

func freeOpts(h optHandle) {
	if h != nil {
		cDestroyOpt(h)
	}
}

// progressDelay is the progress thread's poll timeout; 0 means DefaultProgressDelay.
func progressDelay(d time.Duration) time.Duration {
	if d <= 0 {
		return DefaultProgressDelay
	}
	return d
}
