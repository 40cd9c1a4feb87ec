package testenv

import (
	"net"
	"strconv"
	"syscall"
	"testing"
)

// RefusedPort returns a loopback TCP port that nobody listens on and nobody else can bind until the test
// ends: a socket of this process is bound to it without listening, so connections to it are refused. A port
// picked free and closed (net.Listen(":0"), Close, use the number) can be bound by another program meanwhile
// on a busy machine, and the test then talks to that program instead.
func RefusedPort(tb testing.TB) int {
	tb.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		tb.Fatalf("socket: %v", err)
	}
	tb.Cleanup(func() { _ = syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		tb.Fatalf("bind 127.0.0.1:0: %v", err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		tb.Fatalf("getsockname: %v", err)
	}
	return sa.(*syscall.SockaddrInet4).Port
}

// RefusedAddr is "127.0.0.1:<RefusedPort>".
func RefusedAddr(tb testing.TB) string {
	tb.Helper()
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(RefusedPort(tb)))
}
