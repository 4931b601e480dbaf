package openblas

import "fmt"

// check panics unless the sizes describe row-major matrices that fit their
// slices, as BLAS implementations check before they touch memory: a C
// routine given a short slice would read or write past its end.
func check(transA, transB bool, m, n, k int, a []float32, lda int, b []float32, ldb int, c []float32, ldc int) {
	rowA, colA := m, k
	if transA {
		rowA, colA = k, m
	}
	rowB, colB := k, n
	if transB {
		rowB, colB = n, k
	}
	switch {
	case m < 0 || n < 0 || k < 0:
		panic(fmt.Sprintf("openblas: negative size m=%d n=%d k=%d", m, n, k))
	case lda < max(1, colA) || ldb < max(1, colB) || ldc < max(1, n):
		panic(fmt.Sprintf("openblas: bad leading dimension lda=%d ldb=%d ldc=%d for m=%d n=%d k=%d", lda, ldb, ldc, m, n, k))
	case m == 0 || n == 0:
		return
	case rowA > 0 && len(a) < lda*(rowA-1)+colA:
		panic("openblas: A is too short")
	case rowB > 0 && len(b) < ldb*(rowB-1)+colB:
		panic("openblas: B is too short")
	case len(c) < ldc*(m-1)+n:
		panic("openblas: C is too short")
	}
}
