package nn

import (
	"fmt"
	"runtime"
	"sort"
	"sync"
)

// Backend computes matrix products. Every GEMM in ppnode goes through one.
// Implementations must be safe for concurrent use.
type Backend interface {
	// Name identifies the implementation: "ppnode" (the default), "gonum"
	// (the same GEMM, deterministic) or "openblas".
	Name() string
	// Sgemm computes C = alpha*op(A)*op(B) + beta*C on row-major float32
	// matrices, op(A) m×k, op(B) k×n, C m×n.
	Sgemm(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int)
	// Deterministic reports whether the same inputs give the same bits on
	// every run and every machine, whatever its CPU model, thread count or
	// architecture.
	Deterministic() bool
	// Threads is the number of threads the backend and the layers' own loops
	// may use.
	Threads() int
}

// backendFactory makes a backend that uses the given number of threads.
type backendFactory func(threads int) (Backend, error)

var (
	factoriesMu sync.Mutex // guards factories
	factories   = map[string]backendFactory{"gonum": newDetGemm, "ppnode": newFastGemm}
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
	switch name {
	case "ppnode":
		return 0
	case "gonum":
		return 2
	}
	return 1
}

// NewBackend returns the named backend ("" picks the best compiled in; with
// deterministic set it picks "gonum", ppnode's own GEMM, the only one whose
// bits do not depend on the CPU model or architecture). threads <= 0 means
// all CPUs.
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
