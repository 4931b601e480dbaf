package dataplane

import (
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/ppnode/ppnode/admit"
	"github.com/ppnode/ppnode/nn"
)

// rawConn opens a connection to ln that has not said anything yet.
func rawConn(t *testing.T, p DataPlane, ln Listener) net.Conn {
	t.Helper()
	if im, ok := p.(*Inmem); ok {
		im.mu.Lock()
		pl := im.lns[ln.Addr()]
		im.mu.Unlock()
		c, s := net.Pipe()
		pl.conns <- s // taken by the listener's accept loop
		t.Cleanup(func() { c.Close() })
		return c
	}
	c, err := net.Dial("tcp", ln.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// acceptAsync runs Accept in the background.
func acceptAsync(ln Listener) <-chan Link {
	ch := make(chan Link, 1)
	go func() { l, _ := ln.Accept(); ch <- l }()
	return ch
}

// TestAcceptNotBlocked: a connection that says nothing, and one that stops
// halfway through its Hello, do not delay a correct dialer: handshakes run
// concurrently. A serial listener would make it wait HandshakeTimeout (a
// minute here); the tolerance is 2 s for a loaded machine.
func TestAcceptNotBlocked(t *testing.T) {
	for name, mk := range planes() {
		t.Run(name, func(t *testing.T) {
			checkNoLeak(t)
			p := mk()
			o := Options{HandshakeTimeout: time.Minute}
			ln, err := p.Listen(hello, o)
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			rawConn(t, p, ln) // silent
			slow := rawConn(t, p, ln)
			b, _ := encodeHello(hello)
			go slow.Write(b[:7]) // a pipe's Write waits for the reader
			start := time.Now()
			accepted := acceptAsync(ln)
			l, err := p.Dial(ln.Addr(), hello, o)
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			a := <-accepted
			if a == nil {
				t.Fatal("no link accepted")
			}
			defer a.Close()
			if d := time.Since(start); d > 2*time.Second {
				t.Errorf("the correct dialer got its link after %v, want well under the 1 min handshake timeout", d)
			}
			// Close ends the two handshakes still in progress (checkNoLeak).
			start = time.Now()
			ln.Close()
			if d := time.Since(start); d > 2*time.Second {
				t.Errorf("Close took %v with 2 handshakes in progress", d)
			}
		})
	}
}

// TestHandshakeTimeoutEach: each handshake has its own deadline: a silent
// connection is dropped after HandshakeTimeout (200 ms; tolerance 3 s).
func TestHandshakeTimeoutEach(t *testing.T) {
	checkNoLeak(t)
	ln, err := (&TCP{}).Listen(hello, Options{HandshakeTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c := rawConn(t, &TCP{}, ln)
	start := time.Now()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err = c.Read(make([]byte, 1))
	if d := time.Since(start); err == nil || errors.Is(err, errDeadline) || d < 150*time.Millisecond || d > 3*time.Second {
		t.Errorf("silent connection: read %v after %v, want it closed after about 200 ms", err, d)
	}
}

// TestHandshakeBound: at most maxHandshakes run at once; a connection over
// the bound is closed at once, a correct dialer is told the listener hung
// up, and once a handshake ends the listener admits again.
func TestHandshakeBound(t *testing.T) {
	checkNoLeak(t)
	p := &TCP{Gate: admit.NewGate(admit.Limits{PerIP: 2 * maxHandshakes}, nil)} // the listener's bound, not the gate's
	o := Options{HandshakeTimeout: time.Minute}
	ln, err := p.Listen(hello, o)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	silent := make([]net.Conn, maxHandshakes)
	for i := range silent {
		silent[i] = rawConn(t, p, ln) // accepted in order: they fill the slots
	}
	over := rawConn(t, p, ln)
	over.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := over.Read(make([]byte, 1)); err == nil || errors.Is(err, errDeadline) {
		t.Fatalf("connection %d: read %v, want it closed at once", maxHandshakes+1, err)
	}
	if _, err := p.Dial(ln.Addr(), hello, o); err == nil || !strings.Contains(err.Error(), "hung up") {
		t.Fatalf("Dial over the bound: %v, want the listener hung up", err)
	}
	silent[0].Close()
	// The listener sees that close some time later: each failed Dial is
	// one more event, and the next one after it succeeds.
	accepted := acceptAsync(ln)
	deadline := time.Now().Add(5 * time.Second)
	var l Link
	for l == nil && time.Now().Before(deadline) {
		l, err = p.Dial(ln.Addr(), hello, o)
	}
	if l == nil {
		t.Fatalf("Dial after a slot freed: %v", err)
	}
	defer l.Close()
	if a := <-accepted; a == nil {
		t.Fatal("no link accepted")
	} else {
		a.Close()
	}
	start := time.Now()
	ln.Close()
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("Close took %v with %d handshakes in progress", d, maxHandshakes-1)
	}
}

// TestFloodFromOneAddress: a flood of silent connections from one address
// takes at most the gate's PerIP of the data plane's handshakes (the
// others are closed at once), and a dialer from another address gets its
// link at once, on every listener of the data plane.
func TestFloodFromOneAddress(t *testing.T) {
	checkNoLeak(t)
	p := &TCP{Gate: admit.NewGate(admit.Limits{PerIP: 8}, nil)}
	o := Options{HandshakeTimeout: time.Minute}
	var lns []Listener
	for range 2 {
		ln, err := p.Listen(hello, o)
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		lns = append(lns, ln)
	}
	flooder := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}}
	var closed int
	for i := range 2 * maxHandshakes {
		c, err := flooder.Dial("tcp", lns[i%2].Addr())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		if _, err := c.Read(make([]byte, 1)); !errors.Is(err, errDeadline) {
			closed++ // refused: the gate closed it
		}
	}
	if want := 2*maxHandshakes - 8; closed != want {
		t.Errorf("%d of the flood's %d connections closed at once, want %d", closed, 2*maxHandshakes, want)
	}
	if s := p.Gate.Stats(); s.RefusedPerIP != uint64(closed) || s.InHandshake != 8 {
		t.Errorf("gate %+v", s)
	}
	for _, ln := range lns {
		accepted := acceptAsync(ln)
		start := time.Now()
		l, err := p.Dial(ln.Addr(), hello, o)
		if err != nil {
			t.Fatalf("Dial during the flood: %v", err)
		}
		l.Close()
		if a := <-accepted; a == nil {
			t.Fatal("no link accepted")
		} else {
			a.Close()
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Errorf("the link took %v during the flood", d)
		}
	}
}

// TestCloseUnaccepted: a link admitted while nobody called Accept is
// closed by the listener's Close; its dialer sees the end.
func TestCloseUnaccepted(t *testing.T) {
	for name, mk := range planes() {
		t.Run(name, func(t *testing.T) {
			checkNoLeak(t)
			p := mk()
			ln, err := p.Listen(hello, Options{})
			if err != nil {
				t.Fatal(err)
			}
			l, err := p.Dial(ln.Addr(), hello, Options{IOTimeout: 5 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			ln.Close()
			if _, _, err := l.Recv(nil); err != io.EOF {
				t.Errorf("Recv on a link the listener dropped: %v, want io.EOF", err)
			}
			if _, err := ln.Accept(); !errors.Is(err, ErrClosed) {
				t.Errorf("Accept after Close: %v", err)
			}
		})
	}
}

// TestSendAfterCallerError: a Send refused for a bad argument leaves the
// link counting what it sends.
func TestSendAfterCallerError(t *testing.T) {
	snd, rcv := pair(t, &TCP{}, Options{})
	if err := snd.Send(Tag{Kind: KindActivation}, nil); err == nil {
		t.Fatal("Send of nil succeeded")
	}
	snd.SetCodec(200)
	if err := snd.Send(Tag{Kind: KindActivation}, nn.New(4)); err == nil {
		t.Fatal("Send with a bad codec succeeded")
	}
	snd.SetCodec(0)
	sent := make(chan error, 1)
	go func() { sent <- snd.Send(Tag{Kind: KindActivation}, nn.New(4)) }()
	if _, _, err := rcv.Recv(nil); err != nil {
		t.Fatal(err)
	}
	if err := <-sent; err != nil { // Send counts once its write returned
		t.Fatal(err)
	}
	if got, want := snd.Stats()[KindActivation].WireBytes, RawWireBytes([]int{4}); got != want {
		t.Errorf("WireBytes = %d, want %d", got, want)
	}
}

// FuzzServerHandshake: whatever a dialer sends, a listener (with a key or
// without) refuses or admits it without panicking or reading past the
// handshake's deadline.
func FuzzServerHandshake(f *testing.F) {
	plain, _ := encodeHello(hello)
	keyed, _ := helloBytes(hello, helloSealed)
	f.Add(plain, false)
	f.Add(append(clone(keyed), make([]byte, nonceLen+proofLen)...), true)
	f.Add(keyed[:10], true)
	f.Add([]byte{tlsRecordHS, 3, 1, 0xff, 0xff}, false)
	f.Add([]byte{tlsRecordHS, 3, 1, 0, 2, 1, 0}, false)
	f.Fuzz(func(t *testing.T, in []byte, withKey bool) {
		var s security
		if withKey {
			s.key = testKey
		}
		c, srv := net.Pipe()
		done := make(chan struct{})
		go func() { // the dialer: its bytes, then whatever comes back
			defer close(done)
			c.Write(in)
			io.Copy(io.Discard, c)
		}()
		lk, err := serverHandshake(srv, hello, Options{HandshakeTimeout: 50 * time.Millisecond}.WithDefaults(), s)
		if err == nil {
			lk.Close()
		}
		srv.Close()
		c.Close()
		<-done
	})
}
