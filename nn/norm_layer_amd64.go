//go:build !purego

package nn

// The AVX2 kernels of LayerNorm's loops (norm_layer_amd64.s). Each takes
// the first n values of a row, or n columns, n a positive multiple of 8,
// and gives the loops' bits; w (and b) may be nil where the layer has no
// affine parameters.

// lnNormAVX2 writes xh[j] = float32((float64(x[j]) − mean)·inv) and, with
// w, y[j] = float32(xh[j]·w[j]) + b[j].
//
//go:noescape
func lnNormAVX2(x, xh, y *float32, n int, mean, inv float64, w, b *float32)

// lnGradAVX2 writes dx[j] = float32(inv·((float64(g) − a) − float64(xh[j])·b))
// with g = dy[j]·w[j] (dy[j] without w).
//
//go:noescape
func lnGradAVX2(dy, xh, dx *float32, n int, w *float32, a, b, inv float64)

// lnColSumsAVX2 adds, for each of rows rows of stride floats in row order,
// float32(dy·xh) to dw[j] and dy to db[j], for the first n columns.
//
//go:noescape
func lnColSumsAVX2(dy, xh *float32, rows, stride, n int, dw, db *float32)

// lnMoments8 sets s[i] and s[8+i] to the sums S₁ and S₂ of rowMoments4
// over the first n columns (n a multiple of 4) of eight rows of stride
// floats from x, each shifted by k[i], in row order.
//
//go:noescape
func lnMoments8(x *float32, stride, n int, k *[8]float64, s *[16]float64)

// lnGradSumsRow sets s to gradSumsRow's sums over the first n values of a
// row (n a positive multiple of 8).
//
//go:noescape
func lnGradSumsRow(dy, xh, w *float32, n int, s *[2]float64)

// lnKernels reports whether the kernels run.
func lnKernels() bool { return hasAVX2 }
