//go:build !race

package dataplane

import (
	"testing"
	"time"

	"github.com/ppnode/ppnode/nn"
	"github.com/ppnode/ppnode/tensorio"
)

// TestSteadyStateAllocs: sending and receiving tensors of a steady shape
// into a reused destination allocates nothing, for raw and a compressing
// codec.
func TestSteadyStateAllocs(t *testing.T) {
	for _, c := range []tensorio.Codec{tensorio.CodecRaw, tensorio.CodecSparse} {
		snd, rcv := pair(t, &TCP{}, Options{Codec: c, IOTimeout: 5 * time.Second})
		src, dst := nn.New(32, 64), nn.New(32, 64)
		for i := range nn.F32(src) {
			nn.F32(src)[i] = float32(i % 3)
		}
		step := func() {
			if err := snd.Send(Tag{Kind: KindActivation}, src); err != nil {
				t.Fatal(err)
			}
			if _, _, err := rcv.Recv(dst); err != nil {
				t.Fatal(err)
			}
			// and back
			if err := rcv.Send(Tag{Kind: KindGradient}, dst); err != nil {
				t.Fatal(err)
			}
			if _, _, err := snd.Recv(src); err != nil {
				t.Fatal(err)
			}
		}
		step()
		if n := testing.AllocsPerRun(200, step); n != 0 {
			t.Errorf("codec %v: %v allocations per round trip, want 0", c, n)
		}
	}
}
