package connector_test

import (
	"encoding/json"
	"io"
	"net"
	"strconv"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// stallProxy stands between a peer and a side channel so that a test can act while the peer is known to be
// mid-handshake, whatever the machine's speed: each connection it accepts waits, unread, until Release, and
// is then forwarded both ways to the side channel. Its port is bound by the proxy itself (never picked free
// and bound later), and Arrived is closed when the first connection comes. Cleanup closes everything and
// waits for its goroutines.
type stallProxy struct {
	ln      net.Listener
	target  string
	arrived chan struct{}
	release chan struct{}

	arriveOnce, releaseOnce sync.Once
	mu                      sync.Mutex
	conns                   []net.Conn
	closed                  bool
	wg                      sync.WaitGroup
}

// newStallProxy starts a proxy on 127.0.0.1 to the side channel at host:port.
func newStallProxy(t *testing.T, host string, port int) *stallProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &stallProxy{ln: ln, target: net.JoinHostPort(host, strconv.Itoa(port)),
		arrived: make(chan struct{}), release: make(chan struct{})}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

// Port is the proxy's own port.
func (p *stallProxy) Port() int { return p.ln.Addr().(*net.TCPAddr).Port }

// Arrived is closed once a peer has connected (and waits).
func (p *stallProxy) Arrived() <-chan struct{} { return p.arrived }

// Release lets the waiting connections (and any later one) through.
func (p *stallProxy) Release() { p.releaseOnce.Do(func() { close(p.release) }) }

func (p *stallProxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.conns = append(p.conns, c)
	return true
}

func (p *stallProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if !p.track(c) {
			c.Close()
			return
		}
		p.arriveOnce.Do(func() { close(p.arrived) })
		p.wg.Add(1)
		go p.serve(c)
	}
}

func (p *stallProxy) serve(c net.Conn) {
	defer p.wg.Done()
	defer c.Close()
	<-p.release
	up, err := net.Dial("tcp", p.target)
	if err != nil {
		return
	}
	if !p.track(up) {
		up.Close()
		return
	}
	defer up.Close()
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		io.Copy(dst, src) //nolint:errcheck // either side's end ends both
		done <- struct{}{}
	}
	go pipe(up, c)
	go pipe(c, up)
	<-done
	c.Close()
	up.Close()
	<-done
}

func (p *stallProxy) close() {
	p.mu.Lock()
	p.closed = true
	conns := p.conns
	p.mu.Unlock()
	p.ln.Close()
	p.Release()
	for _, c := range conns {
		c.Close()
	}
	p.wg.Wait()
}

// withRemotePort is kv_transfer_params kv with remote_port replaced by port (and remote_host by 127.0.0.1).
func withRemotePort(t *testing.T, kv json.RawMessage, port int) json.RawMessage {
	t.Helper()
	var m map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(kv, &m))
	m["remote_port"] = json.RawMessage(strconv.Itoa(port))
	m["remote_host"] = json.RawMessage(`"127.0.0.1"`)
	out, err := json.Marshal(m)
	require.NoError(t, err)
	return out
}

// remoteSideChannel is kv_transfer_params kv's remote_host and remote_port.
func remoteSideChannel(t *testing.T, kv json.RawMessage) (string, int) {
	t.Helper()
	var a struct {
		Host string `json:"remote_host"`
		Port int    `json:"remote_port"`
	}
	require.NoError(t, json.Unmarshal(kv, &a))
	require.NotZero(t, a.Port, "no remote_port in %s", kv)
	return a.Host, a.Port
}
