//go:build !purego

package nn

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// kernelInput is n values of gen, then each of specials at every position
// of a block of four in turn.
func kernelInput(n int, gen func() float32, specials ...float32) []float32 {
	x := make([]float32, 0, n+5*len(specials))
	for range n {
		x = append(x, gen())
	}
	for k, v := range specials {
		x = append(x, make([]float32, k%5)...)
		x = append(x, v)
	}
	return x
}

// loopAndKernel is what f returns with the loops and with the kernels.
func loopAndKernel[T any](f func() T) (loop, kernel T) {
	hasAVX2 = false
	loop = f()
	hasAVX2 = true
	return loop, f()
}

// sameBits fails t at the first value of got whose bits are not want's,
// which what(i) names.
func sameBits(t *testing.T, want, got []float32, what func(i int) string) {
	t.Helper()
	for i := range want {
		if math.Float32bits(want[i]) != math.Float32bits(got[i]) {
			t.Fatalf("%s: loop %g, kernel %g", what(i), want[i], got[i])
		}
	}
}

// GELU's AVX2 kernel gives the bits of normal's loop for every value it
// takes, and leaves the values normal's other branches handle (|x| >= 12,
// NaN, infinities) to the loop, whatever their position.
func TestGELUKernelMatchesLoop(t *testing.T) {
	if !hasAVX2 {
		t.Skip("no AVX2")
	}
	r := rand.New(rand.NewPCG(1, 2))
	x := kernelInput(1<<15, func() float32 { return float32(r.NormFloat64() * 3) })
	x = append(x, kernelInput(1<<14, func() float32 { return float32(r.Float64()*24 - 12) },
		0, float32(math.Copysign(0, -1)), 11.999999, -11.999999, 12, -12, 37.7, -37.7, 40, -40,
		float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN()), math.MaxFloat32, -math.MaxFloat32,
		math.SmallestNonzeroFloat32, -math.SmallestNonzeroFloat32, 1e-30, -1e-30, 0.5, -0.5, 1, -1)...)
	for _, n := range []int{len(x), len(x) - 1, 3, 5, 1} {
		want, got := loopAndKernel(func() [3][]float32 {
			out := [3][]float32{make([]float32, n), make([]float32, n), make([]float32, n)}
			geluRange(x[:n], out[0], out[1], out[2])
			return out
		})
		for k := range want {
			sameBits(t, want[k], got[k], func(i int) string { return fmt.Sprintf("n=%d: output %d of x=%g", n, k, x[i]) })
		}
	}
	if done := geluVector(x[:4], make([]float32, 4), make([]float32, 4), make([]float32, 4)); done != 4 {
		t.Errorf("the kernel did %d of four ordinary values, want 4", done)
	}
}

// Softmax's exponentials by the AVX2 kernel are expFast's bits, and so
// are their sum in row order and the probabilities it scales them to,
// with masked (−Inf) values, exponents in expFast's subnormal range and
// beyond it, NaN, at every position of a block of four.
func TestSoftmaxExpKernelMatchesLoop(t *testing.T) {
	if !hasAVX2 {
		t.Skip("no AVX2")
	}
	r := rand.New(rand.NewPCG(3, 4))
	x := kernelInput(1<<11, func() float32 { return float32(r.NormFloat64() * 8) },
		float32(math.Inf(-1)), -700, -708.5, -720, -745, -746, -1e9, float32(math.NaN()), 0, 3)
	type row struct {
		ys  []float32
		sum float64
	}
	for _, n := range []int{len(x), len(x) - 3, 4, 7, 2} {
		for _, m := range []float64{0, 10, -3.5} {
			want, got := loopAndKernel(func() row {
				ys := make([]float32, n)
				return row{ys, expRow(x[:n], ys, m)}
			})
			if math.Float64bits(want.sum) != math.Float64bits(got.sum) && !(math.IsNaN(want.sum) && math.IsNaN(got.sum)) {
				t.Errorf("n=%d m=%v: sum %v by the loop, %v by the kernel", n, m, want.sum, got.sum)
			}
			sameBits(t, want.ys, got.ys, func(i int) string { return fmt.Sprintf("n=%d m=%v: e^(%g−m)", n, m, x[i]) })
		}
	}
	for _, inv := range []float64{1 / 3.0, 1e-40, 0x1p-120, 2} {
		for _, n := range []int{len(x), len(x) - 3, 4, 2} {
			want, got := loopAndKernel(func() []float32 {
				ys := append([]float32(nil), x[:n]...)
				normalizeRow(ys, inv)
				return ys
			})
			sameBits(t, want, got, func(i int) string { return fmt.Sprintf("n=%d: %g·%g", n, x[i], inv) })
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
	k := 0
	x := kernelInput(3<<13, func() float32 {
		k++
		return float32([]float64{r.NormFloat64() * 4, r.Float64()*50 - 25, r.NormFloat64() * 1e-6}[k%3])
	}, 0, float32(math.Copysign(0, -1)), 20, -20, 20.001, -20.001, 707.9, -707.9, 708.1, -708.1,
		800, -800, float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1)), math.SmallestNonzeroFloat32, 1e-30)
	for _, f := range []struct {
		name   string
		apply  func(xs, ys []float32)
		vector func(x, y []float32) int
	}{{"sigmoid", sigmoidRange, sigmoidVector}, {"tanh", tanhRange, tanhVector}} {
		for _, n := range []int{len(x), len(x) - 1, 6, 3} {
			want, got := loopAndKernel(func() []float32 {
				ys := make([]float32, n)
				f.apply(x[:n], ys)
				return ys
			})
			inPlace := append([]float32(nil), x[:n]...)
			f.apply(inPlace, inPlace)
			what := func(i int) string { return fmt.Sprintf("%s(%g), n=%d", f.name, x[i], n) }
			sameBits(t, want, got, what)
			sameBits(t, want, inPlace, func(i int) string { return what(i) + " in place" })
		}
		if done := f.vector(x[:4], make([]float32, 4)); done != 4 {
			t.Errorf("%s: the kernel did %d of four ordinary values, want 4", f.name, done)
		}
	}
}

// benchLoopAndKernel runs f on x as the sub-benchmarks name/loop and
// name/kernel (if the CPU has the kernels).
func benchLoopAndKernel(b *testing.B, name string, x []float32, f func()) {
	vector := hasAVX2
	defer func() { hasAVX2 = vector }()
	for _, v := range []bool{false, vector} {
		b.Run(name+map[bool]string{false: "loop", true: "kernel"}[v], func(b *testing.B) {
			hasAVX2 = v
			b.SetBytes(int64(4 * len(x)))
			for b.Loop() {
				f()
			}
		})
	}
}

// normals is n values of a normal distribution of deviation 2.
func normals(n int) []float32 {
	r := rand.New(rand.NewPCG(1, 2))
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(r.NormFloat64() * 2)
	}
	return x
}

// BenchmarkGELU is GELU's forward pass over a transformer block's
// hidden activations (128 tokens × 1024), with and without the kernel.
func BenchmarkGELU(b *testing.B) {
	x := normals(128 * 1024)
	y, p, d := make([]float32, len(x)), make([]float32, len(x)), make([]float32, len(x))
	benchLoopAndKernel(b, "", x, func() { geluRange(x, y, p, d) })
}

// BenchmarkSigmoidTanh is the two over an LSTM step's gates (64 samples
// × 4 × 256), with and without the kernels.
func BenchmarkSigmoidTanh(b *testing.B) {
	x := normals(64 * 4 * 256)
	y := make([]float32, len(x))
	benchLoopAndKernel(b, "sigmoid/", x, func() { sigmoidRange(x, y) })
	benchLoopAndKernel(b, "tanh/", x, func() { tanhRange(x, y) })
}

// BenchmarkSoftmaxExp is softmax's exponentials over 128 attention rows
// of 128, with and without the kernel.
func BenchmarkSoftmaxExp(b *testing.B) {
	x := normals(128 * 128)
	y := make([]float32, len(x))
	benchLoopAndKernel(b, "", x, func() {
		for row := range 128 {
			expRow(x[row*128:(row+1)*128], y[row*128:(row+1)*128], 8)
		}
	})
}
