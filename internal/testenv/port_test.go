package testenv

import (
	"errors"
	"net"
	"syscall"
	"testing"
	"time"
)

// The port refuses connections and cannot be bound by anyone else while the test runs.
func TestRefusedPort(t *testing.T) {
	addr := RefusedAddr(t)
	_, err := net.DialTimeout("tcp4", addr, 5*time.Second)
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dial %s: %v, want ECONNREFUSED", addr, err)
	}
	if l, err := net.Listen("tcp4", addr); err == nil {
		l.Close()
		t.Fatalf("another socket could bind %s", addr)
	}
}
