package dataplane

import (
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
type Inmem struct {
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
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.lns == nil {
		p.lns = map[string]*pipeListener{}
	}
	p.next++
	addr := fmt.Sprintf("inmem:%d", p.next)
	pl := &pipeListener{p: p, addr: addr, conns: make(chan net.Conn), closed: make(chan struct{})}
	p.lns[addr] = pl
	return &listener{ln: pl, addr: addr, want: want, o: o.WithDefaults()}, nil
}

// Dial connects to a listener of this Inmem and authenticates with h.
func (p *Inmem) Dial(addr string, h Hello, o Options) (Link, error) {
	o = o.WithDefaults()
	if _, err := encodeHello(h); err != nil {
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
	lk, err := clientHandshake(client, h, o)
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
