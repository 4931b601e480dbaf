package linkprobe

import (
	"context"
	"encoding/binary"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/ppnode/ppnode/admit"
	"github.com/ppnode/ppnode/portrange"
)

func TestMeasureLoopback(t *testing.T) {
	s, err := Listen("127.0.0.1", portrange.Range{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	r, err := Measure(context.Background(), s.Addr(), Options{Duration: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("loopback: %.0f Mbit/s, RTT %v, %d bytes in %v", r.BytesPerSec*8/1e6, r.RTT, r.Bytes, r.Took)
	// Loopback carries gigabytes per second here; a probe slower than
	// 100 Mbit/s or with a round trip of 50 ms measures something else.
	if r.BytesPerSec < 12.5e6 || r.RTT <= 0 || r.RTT > 50*time.Millisecond || r.Bytes < 256<<10 {
		t.Fatalf("implausible loopback probe %+v", r)
	}
}

// Bad probes get the connection closed; the server keeps answering.
func TestServerBadInput(t *testing.T) {
	s, err := Listen("127.0.0.1", portrange.Range{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	huge := binary.LittleEndian.AppendUint64([]byte("PPLP\x01b"), 1<<62)
	for name, in := range map[string][]byte{
		"magic":     []byte("HTTP/1.1 GET /"),
		"version":   []byte("PPLP\x09p"),
		"operation": []byte("PPLP\x01z"),
		"huge bulk": huge,
		"zero bulk": binary.LittleEndian.AppendUint64([]byte("PPLP\x01b"), 0),
	} {
		c, err := net.Dial("tcp", s.Addr())
		if err != nil {
			t.Fatal(err)
		}
		c.Write(in)
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		// Closed: EOF, or a reset if our bytes were unread.
		if n, err := io.ReadAll(c); len(n) != 0 || os.IsTimeout(err) {
			t.Errorf("%s: read %q, %v; want the connection closed", name, n, err)
		}
		c.Close()
	}
	if _, err := Measure(context.Background(), s.Addr(), Options{Duration: time.Millisecond}); err != nil {
		t.Fatalf("after bad probes: %v", err)
	}
}

// A cancelled context ends a probe that waits on a silent server.
func TestMeasureCancelled(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close() // connections wait in the backlog, never answered
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := Measure(ctx, ln.Addr().String(), Options{})
		done <- err
	}()
	cancel()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("a probe of a silent server succeeded")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("cancelling did not end the probe")
	}
}

// Connections that never send a header (8 from the prober's own address,
// and a flood from another one beyond the gate's PerIP) do not keep probes
// from the server's slots.
func TestSilentConnectionsDoNotBlockProbes(t *testing.T) {
	g := admit.NewGate(admit.Limits{PerIP: 16}, nil)
	s, err := Listen("127.0.0.1", portrange.Range{}, g)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	flooder := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}}
	for i := range 8 + 64 {
		d := &net.Dialer{}
		if i >= 8 {
			d = &flooder
		}
		c, err := d.Dial("tcp", s.Addr())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	for range 3 {
		if _, err := Measure(context.Background(), s.Addr(), Options{Duration: time.Millisecond}); err != nil {
			t.Fatalf("probe with silent connections open: %v", err)
		}
	}
	if st := g.Stats(); st.RefusedPerIP != 64-16 || st.InHandshake != 8+16 {
		t.Errorf("gate %+v: want the flood's connections beyond 16 refused, the 8 and 16 silent ones in handshake", st)
	}
}
