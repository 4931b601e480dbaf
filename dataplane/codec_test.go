package dataplane

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/ppnode/ppnode/nn"
	"github.com/ppnode/ppnode/tensorio"
)

// testSpeeds is a fixed speed table (bytes of float32 per second), so that
// the choices below do not depend on this machine's load.
var testSpeeds = tensorio.SpeedTable{
	tensorio.CodecRaw:        {Encode: 10e9, Decode: 10e9},
	tensorio.CodecSparse:     {Encode: 8e9, Decode: 8e9},
	tensorio.CodecSparseHuff: {Encode: 1e9, Decode: 1e9},
	tensorio.CodecZstd:       {Encode: 0.5e9, Decode: 1e9},
}

// relu returns ReLU-like activations: half zeros, the rest positive.
func relu(r *rand.Rand, n int) *nn.Tensor {
	t := nn.New(n)
	for i, d := 0, nn.F32(t); i < n; i++ {
		d[i] = max(float32(r.NormFloat64()), 0)
	}
	return t
}

// An Auto link compresses activations over a slow link and sends them raw
// over a fast one; the receiver gets every bit; its stats count both.
func TestAutoCodec(t *testing.T) {
	for name, mk := range planes() {
		t.Run(name, func(t *testing.T) {
			snd, rcv := pair(t, mk(), Options{Auto: true, Rate: 12.5e6, Speeds: testSpeeds})
			r := rand.New(rand.NewPCG(1, 2))
			send := func(k Kind, x *nn.Tensor) {
				t.Helper()
				done := make(chan error, 1)
				go func() { done <- snd.Send(Tag{Kind: k}, x) }()
				_, got, err := rcv.Recv(nil)
				if err != nil || <-done != nil {
					t.Fatal(err)
				}
				for i, v := range nn.F32(x) {
					if math.Float32bits(nn.F32(got)[i]) != math.Float32bits(v) {
						t.Fatalf("element %d: %v, sent %v", i, nn.F32(got)[i], v)
					}
				}
			}
			x := relu(r, 1<<16)
			send(KindActivation, x)
			st := snd.Stats()[KindActivation]
			if st.Codec == tensorio.CodecRaw || st.WireBytes >= st.RawBytes*7/10 || st.Frames != 1 || st.SampleNs <= 0 {
				t.Fatalf("at 100 Mbit/s: %+v, want a compressing codec", st)
			}
			snd.SetRate(1e12)
			send(KindActivation, x)
			st = snd.Stats()[KindActivation]
			if st.Codec != tensorio.CodecRaw || st.Frames != 2 || st.RawBytes != 2*RawWireBytes([]int{1 << 16}) {
				t.Fatalf("at 8 Tbit/s: %+v, want raw", st)
			}
			if got := snd.Stats().Sub(Stats{}); got != snd.Stats() {
				t.Fatalf("Sub of zero changed the stats")
			}
		})
	}
}

// Lossy applies to activations and gradients only: inputs and weights
// stay lossless, bit for bit.
func TestLossyKinds(t *testing.T) {
	snd, rcv := pair(t, &TCP{}, Options{Auto: true, Lossy: tensorio.CodecInt8, Speeds: testSpeeds})
	r := rand.New(rand.NewPCG(3, 4))
	x := relu(r, 4096)
	for _, k := range []Kind{KindActivation, KindGradient, KindInput, KindWeights} {
		done := make(chan error, 1)
		go func() { done <- snd.Send(Tag{Kind: k}, x) }()
		_, got, err := rcv.Recv(nil)
		if err != nil || <-done != nil {
			t.Fatal(err)
		}
		exact := true
		for i, v := range nn.F32(x) {
			exact = exact && nn.F32(got)[i] == v
		}
		lossy := k == KindActivation || k == KindGradient
		if c := snd.Stats()[k].Codec; lossy != (c == tensorio.CodecInt8) || exact == lossy {
			t.Errorf("%v: codec %v, bit-exact %v", k, c, exact)
		}
	}
	snd.SetCodec(tensorio.CodecRaw)
	done := make(chan error, 1)
	go func() { done <- snd.Send(Tag{Kind: KindActivation}, x) }()
	if _, _, err := rcv.Recv(nil); err != nil || <-done != nil {
		t.Fatal(err)
	}
	if c := snd.Stats()[KindActivation].Codec; c != tensorio.CodecRaw {
		t.Errorf("after SetCodec(raw): %v", c)
	}
}
