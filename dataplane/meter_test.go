package dataplane

import (
	"testing"

	"github.com/ppnode/ppnode/nn"
	"github.com/ppnode/ppnode/tensorio"
)

// TCP.Traffic counts, on each side of a link, the frames and bytes sent
// and received by peer: what one side sent is what the other received,
// and the sent bytes are those the link's Stats count.
func TestTrafficCountsBothEnds(t *testing.T) {
	dialer, listener := &TCP{}, &TCP{}
	ln, err := listener.Listen(hello, Options{})
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
	snd, err := dialer.Dial(ln.Addr(), hello, Options{Codec: tensorio.CodecZstd})
	if err != nil {
		t.Fatal(err)
	}
	defer snd.Close()
	r := <-ch
	if r.err != nil {
		t.Fatal(r.err)
	}
	rcv := r.l
	defer rcv.Close()

	x := nn.New(3, 100)
	for i := range nn.F32(x) {
		nn.F32(x)[i] = float32(i % 7)
	}
	// Forward 3 tensors; back 2. Each Send is flushed whole, and each
	// side reads all the other sent before it looks.
	send := func(from, to Link, n int) {
		t.Helper()
		for i := range n {
			if err := from.Send(Tag{Kind: KindActivation, MicroBatch: uint32(i)}, x); err != nil {
				t.Fatal(err)
			}
			if _, _, err := to.Recv(nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	send(snd, rcv, 3)
	send(rcv, snd, 2)

	wire := func(l Link) int64 {
		var n int64
		for _, ks := range l.Stats() {
			n += ks.WireBytes
		}
		return n
	}
	one := func(p *TCP) PeerTraffic {
		t.Helper()
		tr := p.Traffic()
		if len(tr) != 1 || tr[0].Peer != "127.0.0.1" {
			t.Fatalf("traffic %+v, want one peer 127.0.0.1", tr)
		}
		return tr[0]
	}
	d, l := one(dialer), one(listener)
	if want := (PeerTraffic{Peer: "127.0.0.1", SentFrames: 3, SentBytes: wire(snd), RecvFrames: 2, RecvBytes: wire(rcv)}); d != want {
		t.Errorf("dialer's traffic %+v, want %+v", d, want)
	}
	if want := (PeerTraffic{Peer: "127.0.0.1", SentFrames: 2, SentBytes: wire(rcv), RecvFrames: 3, RecvBytes: wire(snd)}); l != want {
		t.Errorf("listener's traffic %+v, want %+v", l, want)
	}
	if raw := 3 * RawWireBytes(x.Shape()); wire(snd) >= raw {
		t.Errorf("zstd link sent %d bytes for %d raw: the meter should count what was written", wire(snd), raw)
	}
}
