//go:build cgo && openblas

package openblas

/*
#cgo LDFLAGS: -lopenblas
// Declared here rather than through cblas.h, whose path differs between
// distributions; the enums are ints in the C ABI.
void openblas_set_num_threads(int);
void cblas_sgemm(int order, int transA, int transB, int m, int n, int k,
	float alpha, const float *a, int lda, const float *b, int ldb,
	float beta, float *c, int ldc);
*/
import "C"

// Available reports whether OpenBLAS is compiled in.
const Available = true

// CBLAS's enum values (cblas.h).
const (
	rowMajor = 101
	noTrans  = 111
	yesTrans = 112
)

// SetThreads sets the number of threads OpenBLAS's own routines use.
func SetThreads(n int) { C.openblas_set_num_threads(C.int(n)) }

// Sgemm computes C = alpha*op(A)*op(B) + beta*C on row-major matrices, op(A)
// m×k, op(B) k×n, C m×n. It panics if a slice is too short for its sizes.
func Sgemm(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	check(transA, transB, m, n, k, a, lda, b, ldb, c, ldc)
	if m == 0 || n == 0 {
		return
	}
	var pa, pb *float32
	if len(a) > 0 {
		pa = &a[0]
	}
	if len(b) > 0 {
		pb = &b[0]
	}
	C.cblas_sgemm(rowMajor, tr(transA), tr(transB), C.int(m), C.int(n), C.int(k),
		C.float(alpha), (*C.float)(pa), C.int(lda), (*C.float)(pb), C.int(ldb),
		C.float(beta), (*C.float)(&c[0]), C.int(ldc))
}

func tr(t bool) C.int {
	if t {
		return yesTrans
	}
	return noTrans
}
