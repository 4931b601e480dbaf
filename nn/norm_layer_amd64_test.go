//go:build !purego

package nn

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// LayerNorm's AVX2 kernels give the loops' bits: output, input gradient and
// parameter gradients, with and without the affine parameters, for widths
// with and without a tail of fewer than 8 (or 32) columns, on one and two
// threads.
func TestLayerNormKernelsMatchLoops(t *testing.T) {
	if !hasAVX2 {
		t.Skip("no AVX2")
	}
	for _, d := range []int{3, 8, 13, 32, 40, 100, 256} {
		for _, rows := range []int{1, 7, 130} {
			for _, threads := range []int{1, 2} {
				for _, affine := range []bool{true, false} {
					t.Run(fmt.Sprintf("D=%d/rows=%d/threads=%d/affine=%v", d, rows, threads, affine), func(t *testing.T) {
						var got [2][][]float32
						for k, vector := range []bool{false, true} {
							hasAVX2 = vector
							got[k] = lnKernelRuns(t, d, rows, threads, affine)
							hasAVX2 = true
						}
						for i := range got[0] {
							for j := range got[0][i] {
								if a, b := math.Float32bits(got[0][i][j]), math.Float32bits(got[1][i][j]); a != b {
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

// lnKernelRuns runs a LayerNorm forward and backward pass over rows×d values
// (twice, so that the parameter gradients accumulate) and returns what they
// wrote.
func lnKernelRuns(t *testing.T, d, rows, threads int, affine bool) [][]float32 {
	be, err := NewBackend("ppnode-det", threads, true)
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(uint64(d), uint64(rows)))
	x, dy := New(rows, d), New(rows, d)
	for i := range F32(x) {
		F32(x)[i] = float32(2 + 3*r.NormFloat64())
		F32(dy)[i] = float32(r.NormFloat64())
	}
	l := &LayerNorm{Eps: 1e-5, NoAffine: !affine}
	if _, err := l.Build([][]int{{d}}); err != nil {
		t.Fatal(err)
	}
	for _, p := range l.Params() {
		for i := range F32(p.Value) {
			F32(p.Value)[i] = float32(1 + 0.5*r.NormFloat64())
		}
	}
	c := &Ctx{Backend: be, Train: true}
	var s Slot
	var out [][]float32
	for range 2 {
		y := l.Forward(c, &s, []*Tensor{x})
		dx := l.Backward(c, &s, []*Tensor{x}, y, dy, []bool{true})[0]
		out = append(out, append([]float32(nil), F32(y)...), append([]float32(nil), F32(dx)...))
	}
	for _, p := range l.Params() {
		out = append(out, append([]float32(nil), F32(p.Grad)...))
	}
	return out
}
