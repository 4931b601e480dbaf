package nn

import (
	"os"
	"sync"

	"github.com/ppnode/ppnode/nn/internal/openblas"
)

// The backend is compiled in with the tag openblas and cgo; the cgo calls
// live in nn/internal/openblas, so that nn itself can hold Go assembly.
func init() {
	if openblas.Available {
		registerBackend("openblas", newOpenBLAS)
	}
}

// OpenBLAS runs single-threaded: its own worker threads spin (sched_yield)
// between calls and fight the layers' goroutines for the CPUs, so the
// backend splits a product over rows or columns of C itself and runs the
// parts on the shared worker goroutines. PPNODE_OPENBLAS_THREADS=native
// lets OpenBLAS thread instead (for comparison).
var (
	openblasOnce   sync.Once
	openblasNative = os.Getenv("PPNODE_OPENBLAS_THREADS") == "native"
)

type openblasBackend struct {
	threads int
}

func newOpenBLAS(threads int) (Backend, error) {
	openblasOnce.Do(func() {
		if openblasNative {
			openblas.SetThreads(threads)
		} else {
			openblas.SetThreads(1)
		}
	})
	return &openblasBackend{threads: threads}, nil
}

func (o *openblasBackend) Name() string { return "openblas" }

// Deterministic is false: OpenBLAS picks its kernels by CPU model, so bits
// differ between machines.
func (o *openblasBackend) Deterministic() bool { return false }
func (o *openblasBackend) Threads() int        { return o.threads }

func (o *openblasBackend) Sgemm(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	if m == 0 || n == 0 {
		return
	}
	work := float64(m) * float64(n) * float64(k)
	if openblasNative || o.threads <= 1 || work < 1<<20 {
		openblas.Sgemm(transA, transB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
		return
	}
	if m >= n {
		parallel(o.threads, m, 16, func(lo, hi int) {
			off := lo * lda
			if transA {
				off = lo
			}
			as := a[off:]
			openblas.Sgemm(transA, transB, hi-lo, n, k, alpha, as, lda, b, ldb, beta, c[lo*ldc:], ldc)
		})
		return
	}
	parallel(o.threads, n, 16, func(lo, hi int) {
		off := lo
		if transB {
			off = lo * ldb
		}
		bs := b[off:]
		openblas.Sgemm(transA, transB, m, hi-lo, k, alpha, a, lda, bs, ldb, beta, c[lo:], ldc)
	})
}
