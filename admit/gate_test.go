package admit

import (
	"crypto/tls"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/ppnode/ppnode/clock"
)

// pipeListener is an in-memory listener: each dial makes a net.Pipe whose
// server end has the remote address given.
type pipeListener struct {
	conns chan net.Conn
	done  chan struct{}
}

func newPipeListener() *pipeListener {
	return &pipeListener{conns: make(chan net.Conn, 64), done: make(chan struct{})}
}

// dial queues a connection from ip and returns its client end.
func (l *pipeListener) dial(ip string) net.Conn {
	server, client := net.Pipe()
	l.conns <- addrConn{server, &net.TCPAddr{IP: net.ParseIP(ip), Port: 40000}}
	return client
}

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *pipeListener) Close() error   { close(l.done); return nil }
func (l *pipeListener) Addr() net.Addr { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 1} }

type addrConn struct {
	net.Conn
	remote net.Addr
}

func (c addrConn) RemoteAddr() net.Addr { return c.remote }

// closedByServer reports whether the server closed c: a read then ends
// with io.EOF at once (a live pipe would block; the deadline bounds that).
func closedByServer(t *testing.T, c net.Conn) bool {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	_, err := c.Read(make([]byte, 1))
	var ne net.Error
	switch {
	case errors.Is(err, io.EOF):
		return true
	case errors.As(err, &ne) && ne.Timeout():
		return false
	}
	t.Fatalf("read: %v", err)
	return false
}

// refused waits until the server has closed c, the client end of a
// connection it refused.
func refused(t *testing.T, c net.Conn) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Fatalf("want the connection refused (EOF), got %v", err)
	}
}

// accepting accepts ln's connections in the background until it closes.
func accepting(ln net.Listener) <-chan net.Conn {
	out := make(chan net.Conn, 64)
	go func() {
		defer close(out)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			out <- c
		}
	}()
	return out
}

// taken returns the server end of the next connection accepted, which
// must be client's.
func taken(t *testing.T, acc <-chan net.Conn, client net.Conn) net.Conn {
	t.Helper()
	defer func() {
		if closedByServer(t, client) {
			t.Fatal("the connection taken was closed")
		}
	}()
	select {
	case c := <-acc:
		return c
	case <-time.After(5 * time.Second):
		t.Fatal("no connection accepted")
		return nil
	}
}

func TestLimits(t *testing.T) {
	fc := clock.NewFake(time.Unix(0, 0))
	g := NewGate(Limits{PerIP: 2, Handshakes: 3, Conns: 4, Handshake: time.Second}, fc)
	pl := newPipeListener()
	ln := g.Listen(pl)
	defer ln.Close()
	acc := accepting(ln)

	// Two from one address are taken, the third is closed at once; another
	// address still gets in.
	a1, a2 := taken(t, acc, pl.dial("10.0.0.1")), taken(t, acc, pl.dial("10.0.0.1"))
	refused(t, pl.dial("10.0.0.1"))
	b1 := taken(t, acc, pl.dial("10.0.0.2"))
	if s := g.Stats(); s.RefusedPerIP != 1 || s.InHandshake != 3 || s.Held != 3 || s.Accepted != 3 {
		t.Fatalf("stats %+v", s)
	}
	// Three in handshake: a fourth address is refused by Handshakes.
	refused(t, pl.dial("10.0.0.3"))
	// Once one is established, 10.0.0.1 may start another handshake, and
	// Conns (4) is reached with it: established connections count.
	Established(a1)
	taken(t, acc, pl.dial("10.0.0.1"))
	Established(a2)
	refused(t, pl.dial("10.0.0.4"))
	// A Close makes room.
	b1.Close()
	taken(t, acc, pl.dial("10.0.0.5"))
	s := g.Stats()
	want := Stats{Accepted: 5, RefusedPerIP: 1, RefusedHandshakes: 1, RefusedConns: 1, InHandshake: 2, Held: 4}
	if s != want {
		t.Fatalf("stats %+v, want %+v", s, want)
	}
	if s.Refused() != 3 {
		t.Fatalf("refused %d, want 3", s.Refused())
	}
}

func TestHandshakeDeadline(t *testing.T) {
	fc := clock.NewFake(time.Unix(0, 0))
	g := NewGate(Limits{Handshake: 5 * time.Second}, fc)
	pl := newPipeListener()
	ln := g.Listen(pl)
	defer ln.Close()

	acc := accepting(ln)
	silent, done := pl.dial("10.0.0.1"), pl.dial("10.0.0.1")
	got := []net.Conn{taken(t, acc, silent), taken(t, acc, done)}
	// The connection that completes its handshake through a TLS wrapper
	// (NetConn) is no longer timed.
	Established(tls.Server(got[1], &tls.Config{}))
	fc.BlockUntil(1) // the silent one's timer; the other's is stopped
	fc.Advance(5*time.Second - time.Nanosecond)
	if closedByServer(t, silent) {
		t.Fatal("closed before its deadline")
	}
	fc.Advance(time.Nanosecond)
	if !closedByServer(t, silent) {
		t.Fatal("a silent connection outlived its handshake deadline")
	}
	if closedByServer(t, done) {
		t.Fatal("an established connection was closed by the deadline")
	}
	if s := g.Stats(); s.TimedOut != 1 || s.InHandshake != 0 || s.Held != 1 {
		t.Fatalf("stats %+v", s)
	}
	// The server's own Close after the deadline's is harmless and counts
	// nothing twice.
	got[0].Close()
	got[1].Close()
	if s := g.Stats(); s.TimedOut != 1 || s.Held != 0 {
		t.Fatalf("stats after closes %+v", s)
	}
	Established(got[0]) // after Close: nothing
	if s := g.Stats(); s.InHandshake != 0 {
		t.Fatalf("stats after a late Established %+v", s)
	}
}

func TestPeerBlocks(t *testing.T) {
	for _, tc := range []struct {
		addr net.Addr
		want string
	}{
		{&net.TCPAddr{IP: net.ParseIP("10.1.2.3")}, "10.1.2.3/32"},
		{&net.TCPAddr{IP: net.ParseIP("::ffff:10.1.2.3")}, "10.1.2.3/32"},
		{&net.TCPAddr{IP: net.ParseIP("2001:db8:1:2:3:4:5:6")}, "2001:db8:1:2::/64"},
		{&net.UnixAddr{Name: "/tmp/s"}, "invalid Prefix"},
	} {
		if got := peerOf(tc.addr).String(); got != tc.want {
			t.Errorf("peerOf(%v) = %s, want %s", tc.addr, got, tc.want)
		}
	}
	// Two hosts of one /64 share its limit.
	if peerOf(&net.TCPAddr{IP: net.ParseIP("2001:db8::1")}) != peerOf(&net.TCPAddr{IP: net.ParseIP("2001:db8::ffff:1")}) {
		t.Error("one /64, two blocks")
	}
}

func TestLimitsDefaults(t *testing.T) {
	l := Limits{PerIP: 7}.WithDefaults()
	if l != (Limits{PerIP: 7, Handshakes: DefaultHandshakes, Conns: DefaultConns, Handshake: DefaultHandshake}) {
		t.Fatalf("%+v", l)
	}
	if err := (Limits{Conns: -1}).Validate(); err == nil {
		t.Fatal("a negative limit passed")
	}
}
