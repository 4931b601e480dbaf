//go:build !purego

package nn

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// BatchNorm's AVX2 kernels give the loops' bits on the deterministic
// backend: output, input gradient, weight and bias gradients and running
// statistics, in training and evaluation, for channel counts with and
// without a tail and row counts below and above the chunked reduction's
// threshold, on one and two threads.
func TestBatchNormKernelsMatchLoops(t *testing.T) {
	if !hasAVX2 {
		t.Skip("no AVX2")
	}
	for _, c := range []int{3, 8, 13, 16, 64, 100} {
		for _, rows := range []int{1, 5, 64, 64*bnChunks + 7} {
			for _, threads := range []int{1, 2} {
				for _, relu := range []bool{false, true} {
					t.Run(fmt.Sprintf("C=%d/rows=%d/threads=%d/relu=%v", c, rows, threads, relu), func(t *testing.T) {
						var got [2][][]float32
						for k, vector := range []bool{false, true} {
							hasAVX2 = vector
							got[k] = bnPasses(t, c, rows, threads, relu)
							hasAVX2 = true
						}
						for i := range got[0] {
							for j := range got[0][i] {
								a, b := math.Float32bits(got[0][i][j]), math.Float32bits(got[1][i][j])
								if a != b {
									t.Fatalf("result %d value %d: loops %g, kernels %g", i, j, got[0][i][j], got[1][i][j])
								}
							}
						}
					})
				}
			}
		}
	}
}

// bnPasses runs a BatchNorm over rows×c values on the deterministic backend,
// applying a ReLU if relu: two training passes and one in evaluation; it
// returns what they wrote.
func bnPasses(t *testing.T, c, rows, threads int, relu bool) [][]float32 {
	be, err := NewBackend("", threads, true)
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(uint64(c), uint64(rows)))
	x, dy := New(rows, c), New(rows, c)
	for i := range F32(x) {
		F32(x)[i] = float32(2 + 3*r.NormFloat64())
		F32(dy)[i] = float32(r.NormFloat64())
	}
	l := NewBatchNorm()
	if _, err := l.Build([][]int{{c}}); err != nil {
		t.Fatal(err)
	}
	for j := range F32(l.Weight.Value) {
		F32(l.Weight.Value)[j] = float32(1 + 0.25*r.NormFloat64())
		F32(l.Bias.Value)[j] = float32(0.5 * r.NormFloat64())
	}
	var res [][]float32
	s := Slot{reluAfter: relu}
	for _, train := range []bool{true, true, false} {
		ctx := &Ctx{Backend: be, Train: train}
		y := l.Forward(ctx, &s, []*Tensor{x})
		g := l.Backward(ctx, &s, []*Tensor{x}, y, dy, []bool{true})
		res = append(res, append([]float32(nil), F32(y)...), append([]float32(nil), F32(g[0])...))
	}
	return append(res, F32(l.Weight.Grad), F32(l.Bias.Grad), F32(l.RunMean.Value), F32(l.RunVar.Value))
}

// ReLU's and Add's AVX2 kernels give the loops' bits, special values
// included (NaN, ±0, ±Inf, subnormals): ReLU forward and backward, an Add
// of three inputs.
func TestReLUKernelsMatchLoops(t *testing.T) {
	if !hasAVX2 {
		t.Skip("no AVX2")
	}
	special := []float32{float32(math.NaN()), float32(math.Copysign(0, -1)), 0, float32(math.Inf(1)),
		float32(math.Inf(-1)), math.SmallestNonzeroFloat32, -math.SmallestNonzeroFloat32, 1, -1}
	be, err := NewBackend("", 2, true)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{1, 7, 8, 9, 100, 1<<16 + 5} {
		r := rand.New(rand.NewPCG(uint64(n), 3))
		x, dy, z := New(n), New(n), New(n)
		for i := range F32(x) {
			F32(x)[i] = float32(r.NormFloat64())
			F32(dy)[i] = float32(r.NormFloat64())
			F32(z)[i] = float32(r.NormFloat64())
			if r.IntN(4) == 0 {
				F32(x)[i] = special[r.IntN(len(special))]
			}
			if r.IntN(4) == 0 {
				F32(dy)[i] = special[r.IntN(len(special))]
			}
		}
		var got [2][3][]float32
		for k, vector := range []bool{false, true} {
			hasAVX2 = vector
			var s Slot
			ctx := &Ctx{Backend: be, Train: true}
			y := ReLU{}.Forward(ctx, &s, []*Tensor{x})
			g := ReLU{}.Backward(ctx, &s, []*Tensor{x}, y, dy, []bool{true})
			var s2 Slot
			sum := Add{}.Forward(ctx, &s2, []*Tensor{x, dy, z})
			got[k] = [3][]float32{append([]float32(nil), F32(y)...), append([]float32(nil), F32(g[0])...), F32(sum)}
			hasAVX2 = true
		}
		for p, name := range []string{"relu forward", "relu backward", "add"} {
			for i := range got[0][p] {
				if a, b := math.Float32bits(got[0][p][i]), math.Float32bits(got[1][p][i]); a != b {
					t.Fatalf("n=%d %s value %d (x=%g): loops %#x, kernels %#x", n, name, i, F32(x)[i], a, b)
				}
			}
		}
	}
}
