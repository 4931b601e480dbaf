//go:build !purego

package nn

import (
	"math"
	"math/rand/v2"
	"testing"
)

// GELU's AVX2 kernel gives the bits of normal's loop for every value it
// takes, and leaves the values normal's other branches handle (|x| >= 12,
// NaN, infinities) to the loop, whatever their position.
func TestGELUKernelMatchesLoop(t *testing.T) {
	if !hasAVX2 {
		t.Skip("no AVX2")
	}
	r := rand.New(rand.NewPCG(1, 2))
	x := make([]float32, 0, 1<<16)
	for range 1 << 15 {
		x = append(x, float32(r.NormFloat64()*3))
	}
	for range 1 << 14 {
		x = append(x, float32(r.Float64()*24-12))
	}
	special := []float32{0, float32(math.Copysign(0, -1)), 11.999999, -11.999999, 12, -12, 37.7, -37.7, 40, -40,
		float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN()), math.MaxFloat32, -math.MaxFloat32,
		math.SmallestNonzeroFloat32, -math.SmallestNonzeroFloat32, 1e-30, -1e-30, 0.5, -0.5, 1, -1}
	for k, v := range special {
		x = append(x, v)
		x = append(x, make([]float32, k%5)...) // at every position of a block of four
	}
	for _, n := range []int{len(x), len(x) - 1, 3, 5, 1} {
		want := make([][]float32, 3)
		got := make([][]float32, 3)
		for i := range want {
			want[i], got[i] = make([]float32, n), make([]float32, n)
		}
		hasAVX2 = false
		geluRange(x[:n], want[0], want[1], want[2])
		hasAVX2 = true
		geluRange(x[:n], got[0], got[1], got[2])
		for i := range want {
			for j := range want[i] {
				if math.Float32bits(want[i][j]) != math.Float32bits(got[i][j]) {
					t.Fatalf("n=%d: output %d of x=%g: loop %g, kernel %g", n, i, x[j], want[i][j], got[i][j])
				}
			}
		}
	}
	if done := geluVector(special[:4], make([]float32, 4), make([]float32, 4), make([]float32, 4)); done != 4 {
		t.Errorf("the kernel did %d of four ordinary values, want 4", done)
	}
}

// Softmax's exponentials by the AVX2 kernel are expFast's bits, and so is
// their sum in row order, and so are the probabilities it scales them to, with masked (−Inf) values, exponents in
// expFast's subnormal range and beyond it, NaN, at every position of a
// block of four.
func TestSoftmaxExpKernelMatchesLoop(t *testing.T) {
	if !hasAVX2 {
		t.Skip("no AVX2")
	}
	r := rand.New(rand.NewPCG(3, 4))
	x := make([]float32, 0, 1<<12)
	for range 1 << 11 {
		x = append(x, float32(r.NormFloat64()*8))
	}
	for k, v := range []float32{float32(math.Inf(-1)), -700, -708.5, -720, -745, -746, -1e9, float32(math.NaN()), 0, 3} {
		x = append(x, make([]float32, k%5)...)
		x = append(x, v)
	}
	for _, n := range []int{len(x), len(x) - 3, 4, 7, 2} {
		for _, m := range []float64{0, 10, -3.5} {
			var ys [2][]float32
			var sums [2]float64
			for k, vector := range []bool{false, true} {
				hasAVX2 = vector
				ys[k] = make([]float32, n)
				sums[k] = expRow(x[:n], ys[k], m)
				hasAVX2 = true
			}
			if math.Float64bits(sums[0]) != math.Float64bits(sums[1]) && !(math.IsNaN(sums[0]) && math.IsNaN(sums[1])) {
				t.Errorf("n=%d m=%v: sum %v by the loop, %v by the kernel", n, m, sums[0], sums[1])
			}
			for i := range ys[0] {
				if math.Float32bits(ys[0][i]) != math.Float32bits(ys[1][i]) {
					t.Fatalf("n=%d m=%v: e^(%g−m): loop %g, kernel %g", n, m, x[i], ys[0][i], ys[1][i])
				}
			}
		}
	}
	for _, inv := range []float64{1 / 3.0, 1e-40, 0x1p-120, 2} {
		for _, n := range []int{len(x), len(x) - 3, 4, 2} {
			var ys [2][]float32
			for k, vector := range []bool{false, true} {
				hasAVX2 = vector
				ys[k] = append([]float32(nil), x[:n]...)
				normalizeRow(ys[k], inv)
				hasAVX2 = true
			}
			for i := range ys[0] {
				if math.Float32bits(ys[0][i]) != math.Float32bits(ys[1][i]) {
					t.Fatalf("n=%d: %g·%g: loop %g, kernel %g", n, x[i], inv, ys[0][i], ys[1][i])
				}
			}
		}
	}
	var sum float64
	if done := expVector([]float32{-1, -2, float32(math.Inf(-1)), 0}, make([]float32, 4), 0, &sum); done != 4 {
		t.Errorf("the kernel did %d of four ordinary values, want 4", done)
	}
}

// Sigmoid's and tanh's AVX2 kernels give the bits of sigmoidFast and
// tanhFast for every value they take, in place too, and leave the others
// (beyond ±708 and ±20, NaN, infinities, signed zeros at the edges) to the
// loop, at every position of a block of four.
func TestSigmoidTanhKernelsMatchLoop(t *testing.T) {
	if !hasAVX2 {
		t.Skip("no AVX2")
	}
	r := rand.New(rand.NewPCG(7, 8))
	x := make([]float32, 0, 1<<15)
	for range 1 << 13 {
		x = append(x, float32(r.NormFloat64()*4), float32(r.Float64()*50-25), float32(r.NormFloat64()*1e-6))
	}
	for k, v := range []float32{0, float32(math.Copysign(0, -1)), 20, -20, 20.001, -20.001, 707.9, -707.9, 708.1, -708.1,
		800, -800, float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1)), math.SmallestNonzeroFloat32, 1e-30} {
		x = append(x, make([]float32, k%5)...)
		x = append(x, v)
	}
	for _, f := range []struct {
		name  string
		apply func(xs, ys []float32)
	}{{"sigmoid", sigmoidRange}, {"tanh", tanhRange}} {
		for _, n := range []int{len(x), len(x) - 1, 6, 3} {
			var ys [2][]float32
			for k, vector := range []bool{false, true} {
				hasAVX2 = vector
				ys[k] = make([]float32, n)
				f.apply(x[:n], ys[k])
				hasAVX2 = true
			}
			inPlace := append([]float32(nil), x[:n]...)
			f.apply(inPlace, inPlace)
			for i := range ys[0] {
				if math.Float32bits(ys[0][i]) != math.Float32bits(ys[1][i]) || math.Float32bits(ys[0][i]) != math.Float32bits(inPlace[i]) {
					t.Fatalf("%s(%g), n=%d: loop %g, kernel %g, in place %g", f.name, x[i], n, ys[0][i], ys[1][i], inPlace[i])
				}
			}
		}
		if done := map[string]func(x, y []float32) int{"sigmoid": sigmoidVector, "tanh": tanhVector}[f.name](x[:4], make([]float32, 4)); done != 4 {
			t.Errorf("%s: the kernel did %d of four ordinary values, want 4", f.name, done)
		}
	}
}

// BenchmarkGELU is GELU's forward pass over a transformer block's
// hidden activations (128 tokens × 1024), with and without the kernel.
func BenchmarkGELU(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 2))
	x := make([]float32, 128*1024)
	for i := range x {
		x[i] = float32(r.NormFloat64() * 2)
	}
	y, p, d := make([]float32, len(x)), make([]float32, len(x)), make([]float32, len(x))
	vector := hasAVX2
	defer func() { hasAVX2 = vector }()
	for _, v := range []bool{false, vector} {
		name := map[bool]string{false: "loop", true: "kernel"}[v]
		b.Run(name, func(b *testing.B) {
			hasAVX2 = v
			b.SetBytes(int64(4 * len(x)))
			for b.Loop() {
				geluRange(x, y, p, d)
			}
		})
	}
}

// BenchmarkSigmoidTanh is the two over an LSTM step's gates (64 samples
// × 4 × 256), with and without the kernels.
func BenchmarkSigmoidTanh(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 2))
	x := make([]float32, 64*4*256)
	for i := range x {
		x[i] = float32(r.NormFloat64() * 2)
	}
	y := make([]float32, len(x))
	vector := hasAVX2
	defer func() { hasAVX2 = vector }()
	for _, f := range []struct {
		name  string
		apply func(xs, ys []float32)
	}{{"sigmoid", sigmoidRange}, {"tanh", tanhRange}} {
		for _, v := range []bool{false, vector} {
			b.Run(f.name+"/"+map[bool]string{false: "loop", true: "kernel"}[v], func(b *testing.B) {
				hasAVX2 = v
				b.SetBytes(int64(4 * len(x)))
				for b.Loop() {
					f.apply(x, y)
				}
			})
		}
	}
}

// BenchmarkSoftmaxExp is softmax's exponentials over 128 attention rows
// of 128, with and without the kernel.
func BenchmarkSoftmaxExp(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 2))
	x := make([]float32, 128*128)
	for i := range x {
		x[i] = float32(r.NormFloat64() * 2)
	}
	y := make([]float32, len(x))
	vector := hasAVX2
	defer func() { hasAVX2 = vector }()
	for _, v := range []bool{false, vector} {
		b.Run(map[bool]string{false: "loop", true: "kernel"}[v], func(b *testing.B) {
			hasAVX2 = v
			b.SetBytes(int64(4 * len(x)))
			for b.Loop() {
				for row := range 128 {
					expRow(x[row*128:(row+1)*128], y[row*128:(row+1)*128], 8)
				}
			}
		})
	}
}
