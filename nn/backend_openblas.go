//go:build cgo && openblas

package nn

/*
#cgo LDFLAGS: -lopenblas
void openblas_set_num_threads(int);
*/
import "C"

import (
	"sync"

	"gonum.org/v1/netlib/blas/netlib"
)

func init() { registerBackend("openblas", newOpenBLAS) }

// openblasMu guards openblasThreads, OpenBLAS's process-wide thread count:
// calls with the current count share the read lock and run at once, a call
// that needs another count waits for them and changes it.
var openblasMu sync.RWMutex

type openblasBackend struct {
	impl    netlib.Implementation
	threads int
}

func newOpenBLAS(threads int) (Backend, error) { return &openblasBackend{threads: threads}, nil }

func (o *openblasBackend) Name() string { return "openblas" }

// Deterministic is false: OpenBLAS picks its kernels by CPU model and splits
// work by thread count, so bits differ between machines.
func (o *openblasBackend) Deterministic() bool { return false }
func (o *openblasBackend) Threads() int        { return o.threads }

func (o *openblasBackend) Sgemm(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	if m == 0 || n == 0 {
		return
	}
	openblasMu.RLock()
	if openblasThreads == o.threads {
		o.impl.Sgemm(trans(transA), trans(transB), m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
		openblasMu.RUnlock()
		return
	}
	openblasMu.RUnlock()
	openblasMu.Lock()
	defer openblasMu.Unlock()
	if openblasThreads != o.threads {
		C.openblas_set_num_threads(C.int(o.threads))
		openblasThreads = o.threads
	}
	o.impl.Sgemm(trans(transA), trans(transB), m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
}

var openblasThreads = -1 // guarded by openblasMu
