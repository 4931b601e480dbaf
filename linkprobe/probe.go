// Package linkprobe measures the network link from this node to another:
// its round-trip time and the rate at which it carries bulk data. Every
// node runs a [Server] on its data-plane host; [Measure] probes one. The
// receiving side times the bulk transfer from its first byte to its last,
// so that the sender's socket buffers do not count.
//
// The protocol, after a 6-byte header ("PPLP", version 1, operation):
//
//	ping  'p': 8-byte messages, each echoed, at most maxPings
//	bulk  'b': u64 length (at most MaxBulk), then that many bytes; the
//	           server answers u64 nanoseconds from the end of its first
//	           read to its last, and u64 bytes its first read held
//
// A server takes connections through an admit gate: a connection must send
// its header within the gate's handshake deadline, and the gate bounds
// those that have not yet, per peer address and in all. Only then does it
// take one of maxConns probe slots (closed at once if none is free), for at
// most connTimeout in all. Silent connections therefore never keep a probe
// from a slot. The server allocates nothing a client claims.
package linkprobe

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/ppnode/ppnode/admit"
	"github.com/ppnode/ppnode/portrange"
)

const (
	magic       = "PPLP"
	version     = 1
	opPing      = 'p'
	opBulk      = 'b'
	maxPings    = 64
	maxConns    = 4
	connTimeout = 10 * time.Second
	// MaxBulk bounds one bulk transfer.
	MaxBulk = 256 << 20
	bufSize = 64 << 10
)

// Server answers probes.
type Server struct {
	ln   net.Listener
	sem  chan struct{} // a slot per probe past its header
	wg   sync.WaitGroup
	mu   sync.Mutex        // guards conn
	conn map[net.Conn]bool // open connections: Close closes them
}

// Listen starts a server on host, on a port of ports (any if zero), whose
// connections g admits (nil: a gate of its own with admit's default
// limits).
func Listen(host string, ports portrange.Range, g *admit.Gate) (*Server, error) {
	ln, err := ports.Listen(host)
	if err != nil {
		return nil, fmt.Errorf("linkprobe: %w", err)
	}
	if g == nil {
		g = admit.NewGate(admit.Limits{}, nil)
	}
	return Serve(g.Listen(ln)), nil
}

// Serve answers probes on ln until Close. ln should be an admit gate's
// listener: each connection holds a goroutine until it has sent its
// header or connTimeout has passed.
func Serve(ln net.Listener) *Server {
	s := &Server{ln: ln, sem: make(chan struct{}, maxConns), conn: map[net.Conn]bool{}}
	s.wg.Add(1)
	go s.accept()
	return s
}

// Addr is the address clients probe.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Close stops the server and ends the probes it runs.
func (s *Server) Close() error {
	err := s.ln.Close()
	s.mu.Lock()
	for c := range s.conn {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	return err
}

func (s *Server) accept() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return
		}
		s.mu.Lock()
		s.conn[c] = true
		s.mu.Unlock()
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			_ = s.serve(c)
			s.mu.Lock()
			delete(s.conn, c)
			s.mu.Unlock()
			c.Close()
		}()
	}
}

// serve answers one probe: once its header has come, if a slot is free.
func (s *Server) serve(c net.Conn) error {
	c.SetDeadline(time.Now().Add(connTimeout))
	var h [6]byte
	if _, err := io.ReadFull(c, h[:]); err != nil {
		return err
	}
	if string(h[:4]) != magic || h[4] != version {
		return fmt.Errorf("linkprobe: bad header %q", h[:])
	}
	admit.Established(c)
	select {
	case s.sem <- struct{}{}:
		defer func() { <-s.sem }()
	default:
		return errors.New("linkprobe: busy") // the client sees a closed connection
	}
	switch h[5] {
	case opPing:
		var b [8]byte
		for range maxPings {
			if _, err := io.ReadFull(c, b[:]); err != nil {
				return err
			}
			if _, err := c.Write(b[:]); err != nil {
				return err
			}
		}
		return nil
	case opBulk:
		var b [16]byte
		if _, err := io.ReadFull(c, b[:8]); err != nil {
			return err
		}
		n := binary.LittleEndian.Uint64(b[:8])
		if n == 0 || n > MaxBulk {
			return fmt.Errorf("linkprobe: bulk of %d bytes", n)
		}
		buf := make([]byte, bufSize)
		first, err := c.Read(buf[:min(uint64(len(buf)), n)])
		if err != nil {
			return err
		}
		t0 := time.Now()
		for left := n - uint64(first); left > 0; {
			m, err := c.Read(buf[:min(uint64(len(buf)), left)])
			if err != nil {
				return err
			}
			left -= uint64(m)
		}
		binary.LittleEndian.PutUint64(b[:8], uint64(time.Since(t0)))
		binary.LittleEndian.PutUint64(b[8:], uint64(first))
		_, err = c.Write(b[:])
		return err
	}
	return fmt.Errorf("linkprobe: unknown operation %q", h[5])
}

// Result is a link's measurement.
type Result struct {
	// BytesPerSec is the rate of a bulk transfer; RTT the median round
	// trip of small messages.
	BytesPerSec float64
	RTT         time.Duration
	// Bytes is what the probe sent, Took how long it took.
	Bytes int64
	Took  time.Duration
}

// Options tune Measure.
type Options struct {
	// Pings is the number of round trips timed (default 5).
	Pings int
	// Duration is about how long the bulk transfer lasts (default 100
	// ms); a first transfer of 256 KiB sizes it.
	Duration time.Duration
}

// Measure probes the server at addr.
func Measure(ctx context.Context, addr string, o Options) (Result, error) {
	if o.Pings <= 0 {
		o.Pings = 5
	}
	if o.Duration <= 0 {
		o.Duration = 100 * time.Millisecond
	}
	start := time.Now()
	var r Result
	rtts, err := ping(ctx, addr, o.Pings)
	if err != nil {
		return r, err
	}
	slices.Sort(rtts)
	r.RTT = rtts[len(rtts)/2]
	// The first transfer sizes the second by the rate the client saw,
	// which the round trip makes low rather than high (the server's times
	// of a small transfer can be a burst out of the socket buffers).
	const first = 256 << 10
	t0 := time.Now()
	if _, err := bulk(ctx, addr, first); err != nil {
		return r, err
	}
	n := int64(first / time.Since(t0).Seconds() * o.Duration.Seconds())
	n = min(max(n, first), MaxBulk)
	if r.BytesPerSec, err = bulk(ctx, addr, n); err != nil {
		return r, err
	}
	r.Bytes, r.Took = first+n+int64(16*o.Pings), time.Since(start)
	return r, nil
}

func dial(ctx context.Context, addr string, op byte) (net.Conn, error) {
	d := net.Dialer{Timeout: 5 * time.Second}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("linkprobe: %w", err)
	}
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	} else {
		c.SetDeadline(time.Now().Add(connTimeout))
	}
	pc := probeConn{c, context.AfterFunc(ctx, func() { c.Close() })}
	if _, err := c.Write(append([]byte(magic), version, op)); err != nil {
		pc.Close()
		return nil, fmt.Errorf("linkprobe: %w", err)
	}
	return pc, nil
}

// probeConn is a client connection that ctx's end closes.
type probeConn struct {
	net.Conn
	stop func() bool
}

func (p probeConn) Close() error {
	p.stop()
	return p.Conn.Close()
}

func ping(ctx context.Context, addr string, n int) ([]time.Duration, error) {
	c, err := dial(ctx, addr, opPing)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	var b, back [8]byte
	var out []time.Duration
	for i := range min(n, maxPings) {
		binary.LittleEndian.PutUint64(b[:], uint64(i))
		t0 := time.Now()
		if _, err := c.Write(b[:]); err != nil {
			return nil, fmt.Errorf("linkprobe: ping: %w", err)
		}
		if _, err := io.ReadFull(c, back[:]); err != nil {
			return nil, fmt.Errorf("linkprobe: ping: %w", err)
		}
		if back != b {
			return nil, errors.New("linkprobe: ping: the echo differs")
		}
		out = append(out, time.Since(t0))
	}
	return out, nil
}

// bulk sends n bytes and returns the rate the server saw.
func bulk(ctx context.Context, addr string, n int64) (float64, error) {
	c, err := dial(ctx, addr, opBulk)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	var h [16]byte
	binary.LittleEndian.PutUint64(h[:8], uint64(n))
	if _, err := c.Write(h[:8]); err != nil {
		return 0, fmt.Errorf("linkprobe: bulk: %w", err)
	}
	buf := make([]byte, bufSize)
	for left := n; left > 0; {
		m, err := c.Write(buf[:min(int64(len(buf)), left)])
		if err != nil {
			return 0, fmt.Errorf("linkprobe: bulk: %w", err)
		}
		left -= int64(m)
	}
	if _, err := io.ReadFull(c, h[:]); err != nil {
		return 0, fmt.Errorf("linkprobe: bulk: no answer: %w", err)
	}
	ns, first := binary.LittleEndian.Uint64(h[:8]), int64(binary.LittleEndian.Uint64(h[8:]))
	if first < 0 || first > n {
		return 0, fmt.Errorf("linkprobe: bulk: the server read %d of %d bytes first", first, n)
	}
	if ns == 0 || n-first <= 0 {
		return float64(n) / time.Microsecond.Seconds(), nil // all in one read: at least this fast
	}
	return float64(n-first) / time.Duration(ns).Seconds(), nil
}
