//go:build !amd64 || purego

package nn

// Without the assembly kernels the loops in norm.go and elementwise.go do
// all the work.

func vector8(n int) int { return 0 }

func bnSumAVX2(x *float32, rows, stride, n int, part *float64) { panic("nn: no kernels") }
func bnSqDevAVX2(x *float32, rows, stride, n int, mean, part *float64) {
	panic("nn: no kernels")
}
func bnNormAVX2(x, y *float32, rows, stride, n int, mean, scale, bias *float32, relu bool) {
	panic("nn: no kernels")
}
func bnGradSumsAVX2(x, dy *float32, rows, stride, n int, mean, inv *float32, p1, p2 *float64, y *float32) {
	panic("nn: no kernels")
}
func bnInputGradAVX2(x, dy, dx *float32, rows, stride, n int, mean, inv, k, a, b, y *float32) {
	panic("nn: no kernels")
}
func reluAVX2(x, y *float32, n int)          { panic("nn: no kernels") }
func reluGradAVX2(y, dy, dx *float32, n int) { panic("nn: no kernels") }
func addAVX2(a, b, y *float32, n int)        { panic("nn: no kernels") }

func geluVector(x, y, cdf, pdf []float32) int               { return 0 }
func expVector(x, y []float32, m float64, sum *float64) int { return 0 }
func sigmoidVector(x, y []float32) int                      { return 0 }
func normalizeVector(y []float32, inv float64) int          { return 0 }
func tanhVector(x, y []float32) int                         { return 0 }
