//go:build !purego

package nn

import (
	"unsafe"

	"golang.org/x/sys/cpu"
)

// The AVX2 kernels of the optimizers (optim_amd64.s). Each updates the
// first n elements, n a positive multiple of 8, of arrays at least that
// long; b is not read without momentum (k.momentum false) and may be nil.
// They are built in every amd64 build but purego: nn has no cgo of its own
// (the go command refuses Go assembly beside cgo), see nn/internal/openblas.

//go:noescape
func sgdAVX2(n int, w, grad, b *float32, k *sgdCoef)

//go:noescape
func adamAVX2(n int, w, grad, m, v *float32, k *adamCoef)

// The assembly reads the coefficients at fixed offsets: these lines stop
// compiling if the structs move a field it reads.
var (
	_ [12]struct{} = [unsafe.Offsetof(sgdCoef{}.decay)]struct{}{}
	_ [13]struct{} = [unsafe.Offsetof(sgdCoef{}.momentum)]struct{}{}
	_ [28]struct{} = [unsafe.Offsetof(adamCoef{}.wd)]struct{}{}
	_ [32]struct{} = [unsafe.Offsetof(adamCoef{}.decay)]struct{}{}
)

// hasAVX2 reports whether the CPU has AVX2 and the OS saves the YMM state.
var hasAVX2 = cpu.X86.HasAVX2

// sgdVector runs the AVX2 kernel on the longest multiple of 8 elements and
// returns how many it updated (0 without AVX2). Not for the first step.
func sgdVector(w, g, b []float32, k *sgdCoef) int {
	n := len(w) &^ 7
	if !hasAVX2 || n == 0 {
		return 0
	}
	g = g[:n]
	var bp *float32
	if k.momentum {
		bp = &b[:n][0]
	}
	sgdAVX2(n, &w[0], &g[0], bp, k)
	return n
}

// adamVector is sgdVector's counterpart for Adam.
func adamVector(w, g, m, v []float32, k *adamCoef) int {
	n := len(w) &^ 7
	if !hasAVX2 || n == 0 {
		return 0
	}
	g, m, v = g[:n], m[:n], v[:n]
	adamAVX2(n, &w[0], &g[0], &m[0], &v[0], k)
	return n
}
