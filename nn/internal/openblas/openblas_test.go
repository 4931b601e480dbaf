package openblas_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/ppnode/ppnode/nn/internal/openblas"
)

// naive is the oracle: C = alpha*op(A)*op(B) + beta*C in float64.
func naive(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) []float64 {
	out := make([]float64, m*n)
	for i := range m {
		for j := range n {
			s := 0.0
			for p := range k {
				ia, ib := i*lda+p, p*ldb+j
				if transA {
					ia = p*lda + i
				}
				if transB {
					ib = j*ldb + p
				}
				av, bv := a[ia], b[ib]
				s += float64(av) * float64(bv)
			}
			out[i*n+j] = float64(alpha)*s + float64(beta)*float64(c[i*ldc+j])
		}
	}
	return out
}

func TestSgemmMatchesNaive(t *testing.T) {
	if !openblas.Available {
		t.Skip("built without OpenBLAS (tag openblas)")
	}
	rng := rand.New(rand.NewPCG(1, 2))
	fill := func(n int) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = rng.Float32()*2 - 1
		}
		return v
	}
	for _, sz := range [][3]int{{1, 1, 1}, {7, 5, 3}, {33, 17, 65}, {128, 64, 96}} {
		for _, tt := range [][2]bool{{false, false}, {true, false}, {false, true}, {true, true}} {
			m, n, k := sz[0], sz[1], sz[2]
			t.Run(fmt.Sprintf("m=%d,n=%d,k=%d,tA=%v,tB=%v", m, n, k, tt[0], tt[1]), func(t *testing.T) {
				// Leading dimensions with padding, so that strides are exercised.
				rowA, colA := m, k
				if tt[0] {
					rowA, colA = k, m
				}
				rowB, colB := k, n
				if tt[1] {
					rowB, colB = n, k
				}
				lda, ldb, ldc := colA+3, colB+1, n+2
				a, b, c := fill(rowA*lda), fill(rowB*ldb), fill(m*ldc)
				want := naive(tt[0], tt[1], m, n, k, 0.5, a, lda, b, ldb, 2, c, ldc)
				openblas.Sgemm(tt[0], tt[1], m, n, k, 0.5, a, lda, b, ldb, 2, c, ldc)
				for i := range m {
					for j := range n {
						if d := math.Abs(float64(c[i*ldc+j]) - want[i*n+j]); d > 1e-5*float64(k+2) {
							t.Fatalf("C[%d,%d] = %v, want %v", i, j, c[i*ldc+j], want[i*n+j])
						}
					}
				}
			})
		}
	}
}

func TestSgemmPanicsOnShortSlices(t *testing.T) {
	cases := []struct {
		name    string
		a, b, c int // slice lengths for m=n=k=4, no transposes
	}{
		{"short A", 15, 16, 16},
		{"short B", 16, 15, 16},
		{"short C", 16, 16, 15},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Fatal("Sgemm did not panic")
				}
			}()
			openblas.Sgemm(false, false, 4, 4, 4, 1, make([]float32, tc.a), 4, make([]float32, tc.b), 4, 0, make([]float32, tc.c), 4)
		})
	}
}

func TestUnavailablePanics(t *testing.T) {
	if openblas.Available {
		t.Skip("built with OpenBLAS")
	}
	defer func() {
		if recover() == nil {
			t.Fatal("Sgemm without OpenBLAS did not panic")
		}
	}()
	openblas.Sgemm(false, false, 1, 1, 1, 1, []float32{1}, 1, []float32{1}, 1, 0, []float32{0}, 1)
}
