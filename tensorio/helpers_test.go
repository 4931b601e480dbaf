package tensorio

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/ppnode/ppnode/nn"
)

// specials are the float32 bit patterns lossless codecs must keep.
var specials = []uint32{
	0x00000000, // +0
	0x80000000, // -0
	0x7f800000, // +Inf
	0xff800000, // -Inf
	0x7fc00000, // quiet NaN
	0x7f800001, // signalling NaN
	0xffffffff, // negative NaN with full payload
	0x00000001, // smallest denormal
	0x807fffff, // largest negative denormal
	0x7f7fffff, // MaxFloat32
	0x00800000, // smallest normal
}

// fill kinds for test tensors.
const (
	fillGauss   = iota // dense, no exact zeros
	fillReLU           // about half zeros, the rest positive
	fillZero           // all +0
	fillSpecial        // mixed special values, zeros and random bits
	fillBits           // uniformly random bit patterns
	numFills
)

func fillData(r *rand.Rand, d []float32, kind int) {
	for i := range d {
		switch kind {
		case fillGauss:
			x := float32(r.NormFloat64())
			if x == 0 {
				x = 1
			}
			d[i] = x
		case fillReLU:
			d[i] = max(float32(r.NormFloat64()), 0)
		case fillZero:
			d[i] = 0
		case fillSpecial:
			switch r.IntN(3) {
			case 0:
				d[i] = math.Float32frombits(specials[r.IntN(len(specials))])
			case 1:
				d[i] = 0
			default:
				d[i] = math.Float32frombits(r.Uint32())
			}
		case fillBits:
			d[i] = math.Float32frombits(r.Uint32())
		}
	}
}

// randShape returns a shape of rank 1 to 4 with at most maxN elements,
// sometimes with a zero dimension.
func randShape(r *rand.Rand, maxN int) []int {
	rank := 1 + r.IntN(4)
	shape := make([]int, rank)
	n := 1
	for i := range shape {
		d := 1 + r.IntN(max(1, int(math.Pow(float64(maxN), 1/float64(rank)))))
		if n*d > maxN {
			d = 1
		}
		shape[i] = d
		n *= d
	}
	if r.IntN(20) == 0 {
		shape[r.IntN(rank)] = 0
	}
	return shape
}

func randTensor(r *rand.Rand, shape []int, kind int) *nn.Tensor {
	t := nn.New(shape...)
	fillData(r, nn.F32(t), kind)
	return t
}

// sameBits fails the test unless got holds want's bits exactly.
func sameBits(t testing.TB, what string, got, want *nn.Tensor) {
	t.Helper()
	if !nn.SameShape(got.Shape(), want.Shape()) {
		t.Fatalf("%s: shape %v, want %v", what, got.Shape(), want.Shape())
	}
	g, w := nn.F32(got), nn.F32(want)
	if len(g) != len(w) {
		t.Fatalf("%s: %d elements, want %d", what, len(g), len(w))
	}
	for i := range w {
		if math.Float32bits(g[i]) != math.Float32bits(w[i]) {
			t.Fatalf("%s: element %d is %08x, want %08x", what, i, math.Float32bits(g[i]), math.Float32bits(w[i]))
		}
	}
}
