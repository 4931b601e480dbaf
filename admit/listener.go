package admit

import (
	"net"
	"net/netip"
	"sync"
)

// Listen returns ln with the gate's limits: its Accept returns only the
// connections the gate takes, and closes the others at once. Closing the
// listener does not close the connections it returned.
func (g *Gate) Listen(ln net.Listener) net.Listener { return &listener{Listener: ln, g: g} }

type listener struct {
	net.Listener
	g *Gate
}

// Accept returns the next connection the gate takes; ln's errors pass
// through unchanged (a server backs off on a temporary one).
func (l *listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if gc, ok := l.g.Take(c); ok {
			return gc, nil
		}
	}
}

// Take decides on c, a connection a listener outside the gate accepted:
// it returns c wrapped, counted in its handshake, or closes it and returns
// false if it is over a bound (as the gate's listeners do).
func (g *Gate) Take(c net.Conn) (net.Conn, bool) {
	peer := peerOf(c.RemoteAddr())
	if g.admit(peer) != admitted {
		c.Close()
		return nil, false
	}
	gc := &conn{Conn: c, g: g, peer: peer, settled: make(chan struct{})}
	go gc.deadline()
	return gc, true
}

// conn is a connection a gate took. Its handshake ends with Established,
// Close, or the deadline, whichever comes first.
type conn struct {
	net.Conn
	g    *Gate
	peer netip.Prefix

	mu          sync.Mutex // guards established and closed
	established bool
	closed      bool
	settled     chan struct{} // closed when the handshake ends
}

// deadline closes the connection if it is still in its handshake when the
// gate's Handshake has passed.
func (c *conn) deadline() {
	t := c.g.clock.NewTimer(c.g.lim.Handshake)
	select {
	case <-t.C():
		c.close(true)
	case <-c.settled:
		t.Stop()
	}
}

func (c *conn) establish() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.established || c.closed {
		return
	}
	c.established = true
	close(c.settled)
	c.g.establish(c.peer)
}

// NetConn returns the connection the listener accepted (as
// tls.Conn.NetConn does), for the options of its socket.
func (c *conn) NetConn() net.Conn { return c.Conn }

// Close closes the connection and releases its place in the gate.
func (c *conn) Close() error { return c.close(false) }

// close closes the connection; expired says the deadline calls it, which
// then closes it only if it is still in its handshake.
func (c *conn) close(expired bool) error {
	c.mu.Lock()
	if c.closed || expired && c.established {
		c.mu.Unlock()
		if expired {
			return nil
		}
		return c.Conn.Close() // net.Conn's own error for a second Close
	}
	c.closed = true
	inHandshake := !c.established
	if inHandshake {
		close(c.settled)
	}
	c.mu.Unlock()
	c.g.release(c.peer, inHandshake, expired)
	return c.Conn.Close()
}

// Established tells the gate that c, a connection one of its listeners
// returned, has completed its handshake: it no longer counts against
// PerIP and Handshakes, and the handshake deadline no longer applies. A
// server calls it once its peer has proved what the protocol asks (a TLS
// handshake, ppnode's link handshake, a request's headers). c may be a
// wrapper that has NetConn (as *tls.Conn); for a connection of no gate it
// does nothing.
func Established(c net.Conn) {
	for c != nil {
		if gc, ok := c.(*conn); ok {
			gc.establish()
			return
		}
		u, ok := c.(interface{ NetConn() net.Conn })
		if !ok {
			return
		}
		c = u.NetConn()
	}
}
