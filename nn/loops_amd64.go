//go:build !purego

package nn

// The AVX2 kernels of BatchNorm's, ReLU's and Add's deterministic loops
// (loops_amd64.s): the BatchNorm ones take rows rows of stride floats and
// their first n channels, the others n values, n a positive multiple of
// 8; they give the loops' bits.

//go:noescape
func bnSumAVX2(x *float32, rows, stride, n int, part *float64)

//go:noescape
func bnSqDevAVX2(x *float32, rows, stride, n int, mean, part *float64)

//go:noescape
func bnNormAVX2(x, y *float32, rows, stride, n int, mean, scale, bias *float32, relu bool)

//go:noescape
func bnGradSumsAVX2(x, dy *float32, rows, stride, n int, mean, inv *float32, p1, p2 *float64, y *float32)

//go:noescape
func bnInputGradAVX2(x, dy, dx *float32, rows, stride, n int, mean, inv, k, a, b, y *float32)

//go:noescape
func reluAVX2(x, y *float32, n int)

//go:noescape
func reluGradAVX2(y, dy, dx *float32, n int)

//go:noescape
func addAVX2(a, b, y *float32, n int)

// vector8 is how many leading values of n the kernels take (0 without
// AVX2); the loops do the rest.
func vector8(n int) int {
	if !hasAVX2 {
		return 0
	}
	return n &^ 7
}
