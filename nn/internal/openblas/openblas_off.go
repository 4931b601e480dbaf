//go:build !(cgo && openblas)

package openblas

// Available reports whether OpenBLAS is compiled in.
const Available = false

// SetThreads and Sgemm exist so that callers compile; without OpenBLAS
// they panic.
func SetThreads(n int) { panic("openblas: not compiled in (build with -tags openblas and cgo)") }

func Sgemm(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	check(transA, transB, m, n, k, a, lda, b, ldb, c, ldc)
	panic("openblas: not compiled in (build with -tags openblas and cgo)")
}
