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
	// Name identifies the implementation: "ppnode" (the default),
	// "ppnode-det" (the same GEMM, deterministic) or "openblas".
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

// detBackend is the deterministic backend's name: ppnode's own GEMM with
// the layers around it on their deterministic paths.
const detBackend = "ppnode-det"

var (
	factoriesMu sync.Mutex // guards factories
	factories   = map[string]backendFactory{detBackend: newDetGemm, "ppnode": newFastGemm}
)

// backendAliases maps former backend names to current ones. The
// deterministic backend was "gonum" while it drove gonum's Saxpy; scripts
// and job specs written then still name it so.
var backendAliases = map[string]string{"gonum": detBackend}

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
	case detBackend:
		return 2
	}
	return 1
}

// CheckBackend reports whether NewBackend would accept name and
// deterministic, without making the backend: name must be "" (the best
// compiled in), a backend of [Backends] or a former name of one, and with
// deterministic set "" or the deterministic backend ("ppnode-det").
func CheckBackend(name string, deterministic bool) error {
	_, err := backendFactoryFor(name, deterministic)
	return err
}

// backendFactoryFor resolves name as NewBackend does.
func backendFactoryFor(name string, deterministic bool) (backendFactory, error) {
	if to, ok := backendAliases[name]; ok {
		name = to
	}
	if name == "" {
		name = Backends()[0]
		if deterministic {
			name = detBackend
		}
	}
	factoriesMu.Lock()
	f, ok := factories[name]
	factoriesMu.Unlock()
	if !ok {
		return nil, fmt.Errorf("nn: backend %q is not compiled in (have %v)", name, Backends())
	}
	if deterministic && name != detBackend {
		return nil, fmt.Errorf("nn: backend %q is not deterministic; use %s", name, detBackend)
	}
	return f, nil
}

// NewBackend returns the named backend ("" picks the best compiled in; with
// deterministic set it picks "ppnode-det", ppnode's own GEMM, the only one
// whose bits do not depend on the CPU model or architecture). "gonum", the
// deterministic backend's former name, is accepted for it. threads <= 0
// means all CPUs.
func NewBackend(name string, threads int, deterministic bool) (Backend, error) {
	if threads <= 0 {
		threads = runtime.NumCPU()
	}
	f, err := backendFactoryFor(name, deterministic)
	if err != nil {
		return nil, err
	}
	return f(threads)
}
