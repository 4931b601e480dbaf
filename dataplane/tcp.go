package dataplane

import (
	"net"
	"time"
)

// TCP is the data plane over TCP. Its zero value listens on 127.0.0.1 with
// a port chosen by the system.
type TCP struct {
	// Host is the address Listen binds (default 127.0.0.1); the port is
	// always chosen by the system.
	Host string
}

var _ DataPlane = (*TCP)(nil)

// Listen binds Host:0 and returns a listener for want.
func (p *TCP) Listen(want Hello, o Options) (Listener, error) {
	if _, err := encodeHello(want); err != nil {
		return nil, err
	}
	host := p.Host
	if host == "" {
		host = "127.0.0.1"
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return nil, err
	}
	return &listener{ln: ln, addr: ln.Addr().String(), want: want, o: o.WithDefaults()}, nil
}

// Dial connects to addr (host:port) and authenticates with h.
func (p *TCP) Dial(addr string, h Hello, o Options) (Link, error) {
	o = o.WithDefaults()
	if _, err := encodeHello(h); err != nil {
		return nil, err
	}
	c, err := net.DialTimeout("tcp", addr, o.HandshakeTimeout)
	if err != nil {
		return nil, err
	}
	tuneTCP(c.(*net.TCPConn))
	lk, err := clientHandshake(c, h, o)
	if err != nil {
		c.Close()
		return nil, err
	}
	return lk, nil
}

// Keepalive of the data plane's connections: a peer that stops answering
// (its machine gone, the link cut: TCP itself notices neither while the
// connection is idle) breaks an idle link within about
// keepAliveIdle + keepAliveCount*keepAliveInterval (10 s), not the
// system's default of minutes. A stopped or busy process's kernel still
// answers: only the machine or the network failing breaks the link. A
// stage cut off from its coordinator learns so from its idle coordinator
// link and frees itself.
const (
	keepAliveIdle     = 5 * time.Second
	keepAliveInterval = time.Second
	keepAliveCount    = 5
)

// tuneTCP sets a data-plane connection's options: no Nagle delay (tensors
// are flushed whole) and the keepalive above.
func tuneTCP(tc *net.TCPConn) {
	tc.SetNoDelay(true)
	tc.SetKeepAliveConfig(net.KeepAliveConfig{Enable: true, Idle: keepAliveIdle, Interval: keepAliveInterval, Count: keepAliveCount})
}
