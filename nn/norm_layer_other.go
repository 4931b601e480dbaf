//go:build !amd64 || purego

package nn

// Without the assembly kernels (vector8 is 0) LayerNorm's loops do all the
// work.

func lnNormAVX2(x, xh, y *float32, n int, mean, inv float64, w, b *float32) {
	panic("nn: no kernels")
}

func lnGradAVX2(dy, xh, dx *float32, n int, w *float32, a, b, inv float64) {
	panic("nn: no kernels")
}

func lnColSumsAVX2(dy, xh *float32, rows, stride, n int, dw, db *float32) {
	panic("nn: no kernels")
}

func lnMoments8(x *float32, stride, n int, k *[8]float64, s *[16]float64) {
	panic("nn: no kernels")
}

func lnGradSumsRow(dy, xh, w *float32, n int, s *[2]float64) { panic("nn: no kernels") }

func lnKernels() bool { return false }
