//go:build !purego

package nn

import "testing"

// Every amd64 build, the openblas one included, runs the optimizers' bulk
// in the AVX2 kernels when the CPU has them (nn holds no cgo to exclude
// them).
func TestOptimizerKernelsBuiltIn(t *testing.T) {
	if !hasAVX2 {
		t.Skip("CPU without AVX2")
	}
	w, g, b, v := make([]float32, 19), make([]float32, 19), make([]float32, 19), make([]float32, 19)
	if n := sgdVector(w, g, b, &sgdCoef{lr: 0.1, mu: 0.9, momentum: true}); n != 16 {
		t.Errorf("sgdVector updated %d of 19 elements, want 16", n)
	}
	if n := adamVector(w, g, b, v, &adamCoef{b1: 0.9, c1: 0.1, b2: 0.999, c2: 0.001, bc2s: 1, eps: 1e-8, stepSize: 0.1}); n != 16 {
		t.Errorf("adamVector updated %d of 19 elements, want 16", n)
	}
}
