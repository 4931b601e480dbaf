package dataplane

import (
	"net"
	"testing"

	"golang.org/x/sys/unix"
)

// A data-plane connection gives up on data unacknowledged for as long as
// the keepalive gives an idle one (10 s).
func TestUserTimeoutIsSet(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	tc := c.(*net.TCPConn)
	tuneTCP(tc)
	rc, err := tc.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var ms int
	var gerr error
	if err := rc.Control(func(fd uintptr) {
		ms, gerr = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT)
	}); err != nil || gerr != nil {
		t.Fatal(err, gerr)
	}
	if ms != int(userTimeout.Milliseconds()) || ms != 10000 {
		t.Errorf("TCP_USER_TIMEOUT %d ms, want %d", ms, userTimeout.Milliseconds())
	}
}
