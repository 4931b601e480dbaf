package nn

import (
	"fmt"
	"runtime"
	"sort"
	"sync"

	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/gonum"
)

// Backend computes matrix products. Every GEMM in ppnode goes through one.
// Implementations must be safe for concurrent use.
type Backend interface {
	// Name identifies the implementation, for example "openblas" or "gonum".
	Name() string
	// Sgemm computes C = alpha*op(A)*op(B) + beta*C on row-major float32
	// matrices, op(A) m×k, op(B) k×n, C m×n.
	Sgemm(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int)
	// Deterministic reports whether the same inputs give the same bits on
	// every run and every machine of the same architecture.
	Deterministic() bool
	// Threads is the number of threads the backend and the layers' own loops
	// may use.
	Threads() int
}

// backendFactory makes a backend that uses the given number of threads.
type backendFactory func(threads int) (Backend, error)

var (
	factoriesMu sync.Mutex // guards factories
	factories   = map[string]backendFactory{"gonum": newGonum}
)

// registerBackend is called from init by optional, build-tag selected
// backends (OpenBLAS).
func registerBackend(name string, f backendFactory) {
	factoriesMu.Lock()
	defer factoriesMu.Unlock()
	factories[name] = f
}

// Backends lists the backends compiled into this binary, best first.
func Backends() []string {
	factoriesMu.Lock()
	defer factoriesMu.Unlock()
	names := make([]string, 0, len(factories))
	for n := range factories {
		names = append(names, n)
	}
	sort.Slice(names, func(i, j int) bool { return rank(names[i]) < rank(names[j]) })
	return names
}

func rank(name string) int {
	if name == "gonum" {
		return 1
	}
	return 0
}

// NewBackend returns the named backend ("" picks the best compiled in; with
// deterministic set it picks the pure-Go kernel, which is the only one whose
// bits do not depend on the CPU model). threads <= 0 means all CPUs.
func NewBackend(name string, threads int, deterministic bool) (Backend, error) {
	if threads <= 0 {
		threads = runtime.NumCPU()
	}
	if name == "" {
		name = Backends()[0]
		if deterministic {
			name = "gonum"
		}
	}
	factoriesMu.Lock()
	f, ok := factories[name]
	factoriesMu.Unlock()
	if !ok {
		return nil, fmt.Errorf("nn: backend %q is not compiled in (have %v)", name, Backends())
	}
	b, err := f(threads)
	if err != nil {
		return nil, err
	}
	if deterministic && !b.Deterministic() {
		return nil, fmt.Errorf("nn: backend %q is not deterministic; use gonum", name)
	}
	return b, nil
}

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

func newGonum(threads int) (Backend, error) { return &gonumBackend{threads: threads}, nil }

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

func trans(t bool) blas.Transpose {
	if t {
		return blas.Trans
	}
	return blas.NoTrans
}
