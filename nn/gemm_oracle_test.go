package nn

import (
	"sync"

	"gonum.org/v1/gonum/blas/gonum"
)

// The deterministic backend before ppnode had its own GEMM, kept as the
// oracle of gemm_test.go: the fingerprints of deterministic runs were made
// with it. (On arm64 gonum's Saxpy is Go code that the compiler fuses into
// FMADD, so there it is not the chain; the tests compare with it on amd64.)

// gonumBackend is the pure-Go GEMM: a driver of ours around gonum's level-1
// kernel (Saxpy, SSE assembly on amd64). Every element of C is computed as
// beta·c followed by the products alpha·a_il·b_lj added one at a time in
// ascending l, a chain that no blocking, thread count or CPU model changes, so
// its bits are the same on every run and every machine that runs the same
// binary. (Work is split over rows or columns of C only, never over l.)
type gonumBackend struct {
	impl    gonum.Implementation
	threads int
	packs   sync.Pool // *[]float32 scratch for transposed B
}

func newGonumOracle(threads int) *gonumBackend { return &gonumBackend{threads: threads} }

func (g *gonumBackend) Name() string        { return "gonum" }
func (g *gonumBackend) Deterministic() bool { return true }
func (g *gonumBackend) Threads() int        { return g.threads }

// gemmColumnTile is the width of the column panels of B that stay in cache
// while the rows of A pass over them.
const gemmColumnTile = 256

func (g *gonumBackend) Sgemm(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	if m == 0 || n == 0 {
		return
	}
	for i := 0; i < m; i++ {
		row := c[i*ldc : i*ldc+n]
		if beta == 0 {
			clear(row)
		} else if beta != 1 {
			for j := range row {
				row[j] *= beta
			}
		}
	}
	if k == 0 || alpha == 0 {
		return
	}
	var pack *[]float32
	if transB {
		// Pack Bᵀ (n×k) into B (k×n) so that rows of B are contiguous.
		pack = g.scratch(k * n)
		bp := *pack
		for j := 0; j < n; j++ {
			src := b[j*ldb : j*ldb+k]
			for l, v := range src {
				bp[l*n+j] = v
			}
		}
		b, ldb = bp, n
	}
	kernel := func(i0, i1, j0, j1 int) {
		for jc := j0; jc < j1; jc += gemmColumnTile {
			jw := min(gemmColumnTile, j1-jc)
			for i := i0; i < i1; i++ {
				crow := c[i*ldc+jc : i*ldc+jc+jw]
				for l := 0; l < k; l++ {
					var av float32
					if transA {
						av = a[l*lda+i]
					} else {
						av = a[i*lda+l]
					}
					if av == 0 {
						continue
					}
					g.impl.Saxpy(jw, alpha*av, b[l*ldb+jc:l*ldb+jc+jw], 1, crow, 1)
				}
			}
		}
	}
	work := float64(m) * float64(n) * float64(k)
	switch {
	case g.threads <= 1 || work < 1<<18:
		kernel(0, m, 0, n)
	case m >= 4*g.threads:
		parallel(g.threads, m, 1, func(lo, hi int) { kernel(lo, hi, 0, n) })
	default:
		parallel(g.threads, n, 16, func(lo, hi int) { kernel(0, m, lo, hi) })
	}
	if pack != nil {
		g.packs.Put(pack)
	}
}

func (g *gonumBackend) scratch(n int) *[]float32 {
	p, _ := g.packs.Get().(*[]float32)
	if p == nil {
		p = new([]float32)
	}
	if cap(*p) < n {
		*p = make([]float32, n)
	}
	*p = (*p)[:n]
	return p
}
