package dataplane

import (
	"crypto/tls"
	"fmt"
	"net"
	"sync"
	"time"
)

// Inmem is the in-memory twin of [TCP], for tests: its connections are
// net.Pipe pairs, so links go through the same handshake, tags and
// tensorio frames, byte for byte, with the same deadlines. Addresses look
// like "inmem:3" and are only valid within the same Inmem. Unlike TCP a
// pipe has no buffer: a Send completes when the peer has read the bytes.
// The zero value is ready to use; it is safe for concurrent use.
//
// Key, ServerTLS and ClientTLS are TCP's, with the same handshake on the
// pipes, so tests can run a cluster's configuration in memory. Two
// differences: the host of every address is "inmem", the name an empty
// ClientTLS.ServerName becomes; and ServerTLS is used without session
// tickets (a TLS 1.3 server that asks for a client certificate writes them
// before it has read all of the dialer's last flight: over an unbuffered
// pipe, both ends could wait on their writes).
type Inmem struct {
	Key       []byte
	ServerTLS *tls.Config
	ClientTLS *tls.Config

	mu   sync.Mutex
	next int
	lns  map[string]*pipeListener
}

var _ DataPlane = (*Inmem)(nil)

// Listen registers a new address for want.
func (p *Inmem) Listen(want Hello, o Options) (Listener, error) {
	if _, err := encodeHello(want); err != nil {
		return nil, err
	}
	sec := p.security()
	if err := sec.validate(true); err != nil {
		return nil, err
	}
	if sec.server != nil {
		sec.server = sec.server.Clone()
		sec.server.SessionTicketsDisabled = true
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.lns == nil {
		p.lns = map[string]*pipeListener{}
	}
	p.next++
	addr := fmt.Sprintf("inmem:%d", p.next)
	pl := &pipeListener{p: p, addr: addr, conns: make(chan net.Conn), closed: make(chan struct{})}
	p.lns[addr] = pl
	return newListener(pl, addr, want, o, sec, nil), nil
}

func (p *Inmem) security() security {
	return security{key: p.Key, server: p.ServerTLS, client: p.ClientTLS}
}

// Dial connects to a listener of this Inmem and authenticates with h.
func (p *Inmem) Dial(addr string, h Hello, o Options) (Link, error) {
	o = o.WithDefaults()
	if _, err := encodeHello(h); err != nil {
		return nil, err
	}
	sec := p.security()
	if err := sec.validate(false); err != nil {
		return nil, err
	}
	p.mu.Lock()
	pl := p.lns[addr]
	p.mu.Unlock()
	if pl == nil {
		return nil, fmt.Errorf("dataplane: dial %s: connection refused (no listener)", addr)
	}
	client, server := net.Pipe()
	select {
	case pl.conns <- server:
	case <-pl.closed:
		return nil, fmt.Errorf("dataplane: dial %s: connection refused (listener closed)", addr)
	case <-time.After(o.HandshakeTimeout):
		return nil, fmt.Errorf("dataplane: dial %s: timed out waiting for Accept", addr)
	}
	lk, err := clientHandshake(client, addr, h, o, sec)
	if err != nil {
		client.Close()
		return nil, err
	}
	return lk, nil
}

// pipeListener is a net.Listener handing out the server ends of pipes.
type pipeListener struct {
	p      *Inmem
	addr   string
	conns  chan net.Conn
	once   sync.Once
	closed chan struct{}
}

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

func (l *pipeListener) Close() error {
	l.once.Do(func() {
		close(l.closed)
		l.p.mu.Lock()
		delete(l.p.lns, l.addr)
		l.p.mu.Unlock()
	})
	return nil
}

func (l *pipeListener) Addr() net.Addr { return pipeAddr(l.addr) }

type pipeAddr string

func (a pipeAddr) Network() string { return "inmem" }
func (a pipeAddr) String() string  { return string(a) }
