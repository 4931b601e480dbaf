package dataplane

import (
	"errors"
	"net"
	"sync"
	"time"

	"github.com/ppnode/ppnode/admit"
)

// maxHandshakes bounds the handshakes a listener runs at once, each within
// its own HandshakeTimeout: a flood of connections that say nothing holds
// at most this many goroutines and sockets; connections over the bound are
// closed at once.
const maxHandshakes = 64

// listener runs the handshakes of the connections to one net.Listener
// concurrently and hands the admitted links to Accept.
type listener struct {
	ln   net.Listener
	addr string
	want Hello
	o    Options
	sec  security
	m    *meter // counts the links' traffic; nil: not counted

	ready chan *link    // admitted links waiting for Accept
	slots chan struct{} // one per handshake in progress (or link waiting)
	done  chan struct{} // closed by Close
	wg    sync.WaitGroup
	once  sync.Once
	err   error // of closing ln

	mu     sync.Mutex
	closed bool
	conns  map[net.Conn]struct{} // in handshake: Close closes them
}

func newListener(ln net.Listener, addr string, want Hello, o Options, sec security, m *meter) *listener {
	l := &listener{ln: ln, addr: addr, want: want, o: o.WithDefaults(), sec: sec, m: m,
		ready: make(chan *link), slots: make(chan struct{}, maxHandshakes), done: make(chan struct{}),
		conns: map[net.Conn]struct{}{}}
	l.wg.Add(1)
	go l.acceptLoop()
	return l
}

func (l *listener) Addr() string { return l.addr }

// Accept returns the next admitted link; after Close, ErrClosed.
func (l *listener) Accept() (Link, error) {
	select {
	case <-l.done:
		return nil, ErrClosed
	default:
	}
	select {
	case lk := <-l.ready:
		return lk, nil
	case <-l.done:
		return nil, ErrClosed
	}
}

// Close stops accepting, ends the handshakes in progress, closes the
// admitted links nobody accepted, and returns once its goroutines are gone.
func (l *listener) Close() error {
	l.once.Do(func() {
		close(l.done)
		l.err = l.ln.Close()
		l.mu.Lock()
		l.closed = true
		for c := range l.conns {
			c.Close()
		}
		l.mu.Unlock()
	})
	l.wg.Wait()
	return l.err
}

// acceptLoop accepts connections and starts a handshake for each one the
// bound admits, until Close.
func (l *listener) acceptLoop() {
	defer l.wg.Done()
	var delay time.Duration
	for {
		c, err := l.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of file descriptors, say: back off as net/http does.
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			select {
			case <-time.After(delay):
				continue
			case <-l.done:
				return
			}
		}
		delay = 0
		select {
		case l.slots <- struct{}{}:
		default:
			c.Close() // over the bound
			continue
		}
		if !l.track(c) {
			c.Close()
			<-l.slots
			return
		}
		l.wg.Add(1)
		go l.handshake(c)
	}
}

// handshake admits or refuses c and hands its link to Accept.
func (l *listener) handshake(c net.Conn) {
	defer l.wg.Done()
	defer func() { <-l.slots }()
	if tc, ok := tcpConn(c); ok {
		tuneTCP(tc)
	}
	lk, err := serverHandshake(c, l.want, l.o, l.sec)
	l.untrack(c)
	if err != nil {
		c.Close() // refused or broken: the listener goes on
		return
	}
	admit.Established(c)
	if l.m != nil {
		lk.metered(l.m.peer(c.RemoteAddr().String()))
	}
	select {
	case l.ready <- lk:
	case <-l.done:
		lk.Close()
	}
}

// track records c as in handshake; false if the listener is closed.
func (l *listener) track(c net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.closed {
		l.conns[c] = struct{}{}
	}
	return !l.closed
}

func (l *listener) untrack(c net.Conn) {
	l.mu.Lock()
	delete(l.conns, c)
	l.mu.Unlock()
}

// tcpConn is the TCP connection under c, which may be a gate's wrapper.
func tcpConn(c net.Conn) (*net.TCPConn, bool) {
	for {
		switch t := c.(type) {
		case *net.TCPConn:
			return t, true
		case interface{ NetConn() net.Conn }:
			c = t.NetConn()
		default:
			return nil, false
		}
	}
}
