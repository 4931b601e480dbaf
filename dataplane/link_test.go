package dataplane

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ppnode/ppnode/nn"
	"github.com/ppnode/ppnode/tensorio"
)

var hello = Hello{JobID: "job-1", Generation: 3, Link: 1, From: 0, To: 1}

func planes() map[string]func() DataPlane {
	return map[string]func() DataPlane{
		"tcp":   func() DataPlane { return &TCP{} },
		"inmem": func() DataPlane { return &Inmem{} },
	}
}

// pair returns the sending (dialing) and receiving (listening) ends of a
// link of p.
func pair(t testing.TB, p DataPlane, o Options) (snd, rcv Link) {
	t.Helper()
	ln, err := p.Listen(hello, o)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	type res struct {
		l   Link
		err error
	}
	ch := make(chan res, 1)
	go func() { l, err := ln.Accept(); ch <- res{l, err} }()
	snd, err = p.Dial(ln.Addr(), hello, o)
	if err != nil {
		t.Fatal(err)
	}
	r := <-ch
	if r.err != nil {
		t.Fatal(r.err)
	}
	t.Cleanup(func() { snd.Close(); r.l.Close() })
	return snd, r.l
}

// checkNoLeak fails t if goroutines started during the test outlive it.
func checkNoLeak(t *testing.T) {
	before := runtime.NumGoroutine()
	t.Cleanup(func() {
		deadline := time.Now().Add(2 * time.Second)
		for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if n := runtime.NumGoroutine(); n > before {
			buf := make([]byte, 1<<16)
			t.Errorf("%d goroutines before, %d after Close:\n%s", before, n, buf[:runtime.Stack(buf, true)])
		}
	})
}

func randTensor(r *rand.Rand, shape ...int) *nn.Tensor {
	t := nn.New(shape...)
	d := nn.F32(t)
	for i := range d {
		switch r.IntN(4) {
		case 0:
			d[i] = 0 // sparse-friendly
		case 1:
			d[i] = math.Float32frombits(r.Uint32()) // any bits, NaN payloads included
		default:
			d[i] = float32(r.NormFloat64())
		}
	}
	return t
}

func sameBits(a, b *nn.Tensor) bool {
	if fmt.Sprint(a.Shape()) != fmt.Sprint(b.Shape()) {
		return false
	}
	x, y := nn.F32(a), nn.F32(b)
	for i := range x {
		if math.Float32bits(x[i]) != math.Float32bits(y[i]) {
			return false
		}
	}
	return true
}

var shapes = [][]int{{1}, {7}, {3, 5}, {64, 33}, {2, 3, 4, 5}, {128, 256}, {1, 1, 1, 1, 1, 1, 1, 9}, {0, 4}}

// stream sends n tensors of kind k from a to b while checking them on b.
func stream(t *testing.T, a, b Link, k Kind, seed uint64, n int) {
	t.Helper()
	var sent []*nn.Tensor
	r := rand.New(rand.NewPCG(seed, 1))
	for i := range n {
		sent = append(sent, randTensor(r, shapes[i%len(shapes)]...))
	}
	codecs := []tensorio.Codec{tensorio.CodecRaw, tensorio.CodecSparse, tensorio.CodecS2, tensorio.CodecZstd, tensorio.CodecShuffleZstd, tensorio.CodecSparseHuff}
	errc := make(chan error, 1)
	go func() {
		for i, x := range sent {
			a.SetCodec(codecs[(i/len(shapes))%len(codecs)])
			if err := a.Send(Tag{MicroBatch: uint32(i), Tensor: uint32(i % 3), Kind: k}, x); err != nil {
				errc <- err
				return
			}
		}
		errc <- nil
	}()
	var dst *nn.Tensor
	for i, x := range sent {
		tag, got, err := b.Recv(dst)
		if err != nil {
			t.Fatalf("Recv %d: %v", i, err)
		}
		if want := (Tag{MicroBatch: uint32(i), Tensor: uint32(i % 3), Kind: k}); tag != want {
			t.Fatalf("tag %d = %+v, want %+v", i, tag, want)
		}
		if !sameBits(got, x) {
			t.Fatalf("tensor %d (shape %v) differs", i, x.Shape())
		}
		dst = got // reuse: reshaped or replaced as shapes change
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

func TestRoundTrip(t *testing.T) {
	for name, mk := range planes() {
		t.Run(name, func(t *testing.T) {
			checkNoLeak(t)
			snd, rcv := pair(t, mk(), Options{IOTimeout: 5 * time.Second})
			if got := rcv.Peer(); got != hello {
				t.Errorf("Peer = %+v, want %+v", got, hello)
			}
			var wg sync.WaitGroup
			wg.Add(2)
			// Both directions at once: activations forward, gradients back.
			go func() { defer wg.Done(); stream(t, snd, rcv, KindActivation, 1, 96) }()
			go func() { defer wg.Done(); stream(t, rcv, snd, KindGradient, 2, 96) }()
			wg.Wait()
			snd.Close()
			if _, _, err := rcv.Recv(nil); err != io.EOF {
				t.Errorf("Recv after peer's Close: %v, want io.EOF", err)
			}
			select {
			case <-rcv.Done():
			case <-time.After(time.Second):
				t.Error("Done not closed after the link broke")
			}
			if err := snd.Send(Tag{Kind: KindActivation}, nn.New(1)); !errors.Is(err, ErrClosed) {
				t.Errorf("Send after Close: %v, want ErrClosed", err)
			}
		})
	}
}

func TestRefused(t *testing.T) {
	cases := []struct {
		name string
		h    Hello
		want string
	}{
		{"wrong job", Hello{JobID: "job-2", Generation: 3, Link: 1, To: 1}, `job "job-2"`},
		{"old generation", Hello{JobID: "job-1", Generation: 2, Link: 1, To: 1}, "stale plan generation 2, current is 3"},
		{"newer generation", Hello{JobID: "job-1", Generation: 4, Link: 1, To: 1}, "newer"},
		{"wrong link", Hello{JobID: "job-1", Generation: 3, Link: 2, To: 1}, "link 2"},
	}
	for name, mk := range planes() {
		t.Run(name, func(t *testing.T) {
			checkNoLeak(t)
			p := mk()
			ln, err := p.Listen(hello, Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			accepted := make(chan Link, 1)
			go func() {
				l, err := ln.Accept()
				if err != nil {
					t.Error(err)
				}
				accepted <- l
			}()
			for _, c := range cases {
				l, err := p.Dial(ln.Addr(), c.h, Options{})
				var re *RefusedError
				if !errors.As(err, &re) || !strings.Contains(err.Error(), c.want) {
					t.Errorf("%s: Dial = %v, %v; want a RefusedError containing %q", c.name, l, err, c.want)
				}
			}
			// The listener still accepts the right one.
			l, err := p.Dial(ln.Addr(), hello, Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			a := <-accepted
			defer a.Close()
			ln.Close()
			if _, err := ln.Accept(); !errors.Is(err, ErrClosed) {
				t.Errorf("Accept after Close: %v, want ErrClosed", err)
			}
		})
	}
}

// TestPeerGone: a peer that closes, or stops talking, gives an error on the
// other side within the deadline, never a hang.
func TestPeerGone(t *testing.T) {
	big := nn.New(1 << 20) // 4 MiB: more than the socket buffers hold
	for name, mk := range planes() {
		t.Run(name+"/close while sending", func(t *testing.T) {
			checkNoLeak(t)
			snd, rcv := pair(t, mk(), Options{IOTimeout: 2 * time.Second})
			errc := make(chan error, 1)
			go func() {
				for i := 0; ; i++ {
					if err := snd.Send(Tag{MicroBatch: uint32(i), Kind: KindActivation}, big); err != nil {
						errc <- err
						return
					}
				}
			}()
			if _, _, err := rcv.Recv(nil); err != nil {
				t.Fatal(err)
			}
			rcv.Close()
			select {
			case err := <-errc:
				if err == nil || snd.Err() == nil {
					t.Fatalf("Send error %v, Err %v", err, snd.Err())
				}
				t.Logf("sender got: %v", err)
			case <-time.After(5 * time.Second):
				t.Fatal("sender hangs after the receiver closed")
			}
			<-snd.Done()
		})
		t.Run(name+"/silent peer", func(t *testing.T) {
			checkNoLeak(t)
			// A cut link closes nothing: only the deadline notices.
			snd, rcv := pair(t, mk(), Options{IOTimeout: 200 * time.Millisecond})
			start := time.Now()
			_, _, err := rcv.Recv(nil)
			if !errors.Is(err, errDeadline) {
				t.Errorf("Recv from a silent peer: %v, want a timeout", err)
			}
			snd, _ = pair(t, mk(), Options{IOTimeout: 200 * time.Millisecond})
			err = snd.Send(Tag{Kind: KindActivation}, big) // nobody reads
			if !errors.Is(err, errDeadline) {
				t.Errorf("Send to a peer that does not read: %v, want a timeout", err)
			}
			if d := time.Since(start); d > 3*time.Second {
				t.Errorf("errors took %v", d)
			}
		})
	}
}

var errDeadline = errorsDeadline()

func errorsDeadline() error {
	c1, c2 := net.Pipe()
	defer c1.Close()
	defer c2.Close()
	c1.SetReadDeadline(time.Now())
	_, err := c1.Read(make([]byte, 1))
	return err.(interface{ Unwrap() error }).Unwrap()
}

// rawPeer dials a TCP listener, passes the handshake and returns the bare
// connection, to put arbitrary bytes on the wire.
func rawPeer(t *testing.T, ln Listener) net.Conn {
	c, err := net.Dial("tcp", ln.Addr())
	if err != nil {
		t.Fatal(err)
	}
	b, _ := encodeHello(hello)
	if _, err := c.Write(b); err != nil {
		t.Fatal(err)
	}
	if err := readReply(c); err != nil {
		t.Fatal(err)
	}
	return c
}

func goodMessage(t *testing.T) []byte {
	var tag [tagLen]byte
	tag[0] = byte(KindActivation)
	binary.LittleEndian.PutUint32(tag[4:], 7)
	binary.LittleEndian.PutUint32(tag[12:], tensorio.Checksum(tag[:12]))
	f, err := tensorio.AppendFrame(tag[:], randTensor(rand.New(rand.NewPCG(1, 2)), 16, 16), tensorio.CodecRaw)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func TestCorrupt(t *testing.T) {
	good := goodMessage(t)
	cases := []struct {
		name  string
		bytes func() []byte
		eof   bool
	}{
		{"payload bit", func() []byte { b := clone(good); b[len(b)-5] ^= 1; return b }, false},
		{"frame header", func() []byte { b := clone(good); b[tagLen+9] ^= 0x40; return b }, false},
		{"tag", func() []byte { b := clone(good); b[5] ^= 1; return b }, false},
		{"garbage", func() []byte { return []byte(strings.Repeat("not a frame at all!", 8)) }, false},
		{"cut in frame", func() []byte { return good[:len(good)-100] }, true},
		{"cut in tag", func() []byte { return good[:9] }, true},
		{"cut after tag", func() []byte { return good[:tagLen] }, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			checkNoLeak(t)
			ln, err := (&TCP{}).Listen(hello, Options{IOTimeout: 5 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			go func() {
				c2 := rawPeer(t, ln)
				c2.Write(good) // one good tensor first
				c2.Write(c.bytes())
				c2.Close()
			}()
			l, err := ln.Accept()
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			if tag, _, err := l.Recv(nil); err != nil || tag.MicroBatch != 7 {
				t.Fatalf("first Recv: %+v, %v", tag, err)
			}
			_, _, err = l.Recv(nil)
			if !errors.Is(err, tensorio.ErrCorrupt) {
				t.Fatalf("Recv = %v, want ErrCorrupt", err)
			}
			if c.eof && !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Errorf("Recv = %v, want io.ErrUnexpectedEOF too", err)
			}
			if !errors.Is(l.Err(), tensorio.ErrCorrupt) {
				t.Errorf("Err = %v", l.Err())
			}
			t.Log(err)
		})
	}
}

func clone(b []byte) []byte { return append([]byte(nil), b...) }

func TestBadHandshake(t *testing.T) {
	checkNoLeak(t)
	ln, err := (&TCP{}).Listen(hello, Options{HandshakeTimeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	done := make(chan Link)
	go func() { l, _ := ln.Accept(); done <- l }()
	// Garbage, then a silent client: both dropped, the listener goes on.
	c1, _ := net.Dial("tcp", ln.Addr())
	c1.Write([]byte("GET / HTTP/1.1\r\n\r\n"))
	c2, _ := net.Dial("tcp", ln.Addr())
	defer c1.Close()
	defer c2.Close()
	l, err := (&TCP{}).Dial(ln.Addr(), hello, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	a := <-done
	if a == nil {
		t.Fatal("no link accepted")
	}
	a.Close()
	if _, err := (&TCP{}).Dial(ln.Addr(), Hello{}, Options{}); err == nil {
		t.Error("Dial with an empty job id succeeded")
	}
}

func TestSendBadArgs(t *testing.T) {
	snd, rcv := pair(t, &Inmem{}, Options{})
	if err := snd.Send(Tag{}, nn.New(2)); err == nil {
		t.Error("Send with kind 0 succeeded")
	}
	snd.SetCodec(tensorio.Codec(200))
	if err := snd.Send(Tag{Kind: KindGradient}, nn.New(2)); err == nil {
		t.Error("Send with an unknown codec succeeded")
	}
	if snd.Err() != nil {
		t.Fatalf("caller error broke the link: %v", snd.Err())
	}
	snd.SetCodec(tensorio.CodecRaw)
	go snd.Send(Tag{Kind: KindGradient, MicroBatch: 5}, nn.FromData([]float32{1, 2}, 2))
	tag, got, err := rcv.Recv(nil)
	if err != nil || tag.MicroBatch != 5 || nn.F32(got)[1] != 2 {
		t.Fatalf("Recv after caller errors: %+v %v %v", tag, got, err)
	}
}
