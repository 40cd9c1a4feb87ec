package demo

import (
	"net"
	"net/http"
	"sync"
	"syscall"
	"time"
)

// Connection caps of the workers' HTTP servers: idle keep-alive connections cost a file descriptor and some
// 20 KB each (issue 22: 19,500 of them took the process to its fd limit, and /health and the side channel
// stopped answering). DefaultMaxHTTPConns is the cap unless the fd limit leaves less room: at most a quarter
// of RLIMIT_NOFILE (after fdReserve for NIXL, UCX, the side channel and the cache) goes to HTTP.
const (
	DefaultMaxHTTPConns = 1024
	DefaultMaxHeader    = 64 << 10
	fdReserve           = 256
	minHTTPConns        = 16
)

// maxHTTPConns is the cap for this process's fd limit.
func maxHTTPConns() int {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil || rl.Cur > 1<<31 {
		return DefaultMaxHTTPConns
	}
	room := (int64(rl.Cur) - fdReserve) / 4
	return int(max(minHTTPConns, min(DefaultMaxHTTPConns, room)))
}

// connLimiter caps a server's open connections. At the cap a new connection evicts the connection idle
// (between keep-alive requests) the longest; with none idle it is closed at once. So idle keep-alive
// clients cannot lock out a fresh one (a /health probe, a proxy's request), and busy ones are never cut.
type connLimiter struct {
	net.Listener
	max     int
	mu      sync.Mutex
	open    map[net.Conn]time.Time // idle since (zero: active, or not yet served)
	evicted int
	refused int
}

func newConnLimiter(ln net.Listener, max int) *connLimiter {
	return &connLimiter{Listener: ln, max: max, open: map[net.Conn]time.Time{}}
}

// Accept implements net.Listener.
func (l *connLimiter) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		l.mu.Lock()
		if len(l.open) >= l.max {
			var victim net.Conn
			var since time.Time
			for oc, t := range l.open {
				if !t.IsZero() && (victim == nil || t.Before(since)) {
					victim, since = oc, t
				}
			}
			if victim == nil {
				l.refused++
				l.mu.Unlock()
				_ = c.Close()
				continue
			}
			delete(l.open, victim)
			l.evicted++
			_ = victim.Close() // the server sees it closed and forgets it
		}
		l.open[c] = time.Time{}
		l.mu.Unlock()
		return c, nil
	}
}

// connState is the server's ConnState hook: it tracks which connections are idle, and forgets closed ones.
func (l *connLimiter) connState(c net.Conn, st http.ConnState) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.open[c]; !ok {
		return
	}
	switch st {
	case http.StateIdle:
		l.open[c] = time.Now()
	case http.StateActive, http.StateNew:
		l.open[c] = time.Time{}
	case http.StateHijacked, http.StateClosed:
		delete(l.open, c)
	}
}
