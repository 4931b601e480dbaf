package nn

import (
	"fmt"
	"sync"
)

// MatMul is a batched matrix product of its two inputs, C = op(A)·op(B):
// A is [L..., M, K] ([L..., K, M] with TransA), B is [L..., K, P] ([L...,
// P, K] with TransB), both with the same leading dimensions L (zero or
// more), and C is [L..., M, P]. Every sample holds prod(L) products, as
// attention's q·kᵀ and softmax·v per head.
type MatMul struct {
	TransA, TransB bool

	m, k, p int   // op(A) is m×k, op(B) k×p
	count   int   // products per sample, prod(L)
	out     []int // per-sample output shape
}

func (l *MatMul) Kind() string     { return "matmul" }
func (l *MatMul) Params() []*Param { return nil }

func (l *MatMul) Build(in [][]int) ([]int, error) {
	if len(in) != 2 {
		return nil, fmt.Errorf("takes two inputs, got %d", len(in))
	}
	a, b := in[0], in[1]
	if len(a) < 2 || len(a) != len(b) {
		return nil, fmt.Errorf("inputs %v and %v must be matrices of equal rank", a, b)
	}
	r := len(a)
	if !SameShape(a[:r-2], b[:r-2]) {
		return nil, fmt.Errorf("inputs %v and %v differ in their leading dimensions", a, b)
	}
	l.m, l.k = a[r-2], a[r-1]
	if l.TransA {
		l.m, l.k = l.k, l.m
	}
	kb, p := b[r-2], b[r-1]
	if l.TransB {
		kb, p = p, kb
	}
	if kb != l.k {
		return nil, fmt.Errorf("inner dimensions differ: %v (transA %v) and %v (transB %v)", a, l.TransA, b, l.TransB)
	}
	l.p = p
	l.count = Size(a[:r-2])
	l.out = append(append([]int(nil), a[:r-2]...), l.m, l.p)
	return append([]int(nil), l.out...), nil
}

// lda and ldb are the leading dimensions of A and B as stored.
func (l *MatMul) lda() int {
	if l.TransA {
		return l.m
	}
	return l.k
}

func (l *MatMul) ldb() int {
	if l.TransB {
		return l.k
	}
	return l.p
}

func (l *MatMul) Forward(c *Ctx, s *Slot, in []*Tensor) *Tensor {
	n := Rows(in[0])
	y := s.Buf(0, s.withBatch(n, l.out)...)
	batchedGemm(c, gemmBatch{
		count: n * l.count, transA: l.TransA, transB: l.TransB, m: l.m, n: l.p, k: l.k,
		a: F32(in[0]), lda: l.lda(), sa: l.m * l.k,
		b: F32(in[1]), ldb: l.ldb(), sb: l.k * l.p,
		c: F32(y), ldc: l.p, sc: l.m * l.p,
	})
	return y
}

// Backward: d op(A) = dC·op(B)ᵀ and d op(B) = op(A)ᵀ·dC, stored in the
// inputs' layouts.
func (l *MatMul) Backward(c *Ctx, s *Slot, in []*Tensor, out, dout *Tensor, need []bool) []*Tensor {
	g := s.Grads(2)
	n := Rows(in[0])
	m, k, p := l.m, l.k, l.p
	a, b, dc := F32(in[0]), F32(in[1]), F32(dout)
	if need[0] {
		da := s.Buf(1, in[0].Shape()...)
		if !l.TransA {
			// dA (m×k) = dC (m×p) · op(B)ᵀ.
			batchedGemm(c, gemmBatch{count: n * l.count, transA: false, transB: !l.TransB, m: m, n: k, k: p,
				a: dc, lda: p, sa: m * p, b: b, ldb: l.ldb(), sb: k * p, c: F32(da), ldc: k, sc: m * k})
		} else {
			// dA (k×m) = op(B) · dCᵀ.
			batchedGemm(c, gemmBatch{count: n * l.count, transA: l.TransB, transB: true, m: k, n: m, k: p,
				a: b, lda: l.ldb(), sa: k * p, b: dc, ldb: p, sb: m * p, c: F32(da), ldc: m, sc: m * k})
		}
		g[0] = da
	}
	if need[1] {
		db := s.Buf(2, in[1].Shape()...)
		if !l.TransB {
			// dB (k×p) = op(A)ᵀ · dC.
			batchedGemm(c, gemmBatch{count: n * l.count, transA: !l.TransA, transB: false, m: k, n: p, k: m,
				a: a, lda: l.lda(), sa: m * k, b: dc, ldb: p, sb: m * p, c: F32(db), ldc: p, sc: k * p})
		} else {
			// dB (p×k) = dCᵀ · op(A).
			batchedGemm(c, gemmBatch{count: n * l.count, transA: true, transB: l.TransA, m: p, n: k, k: m,
				a: dc, lda: p, sa: m * p, b: a, ldb: l.lda(), sb: m * k, c: F32(db), ldc: k, sc: k * p})
		}
		g[1] = db
	}
	return g
}

// gemmBatch is count products C_i = op(A_i)·op(B_i), the i-th operands at
// offsets i·sa, i·sb and i·sc.
type gemmBatch struct {
	count          int
	transA, transB bool
	m, n, k        int
	a, b, c        []float32
	lda, ldb, ldc  int
	sa, sb, sc     int
}

// gemmBatchPass runs part of a batch on a single-threaded backend; passes
// are pooled with run bound once, so that a batch allocates nothing.
type gemmBatchPass struct {
	gemmBatch
	be  Backend
	run func(lo, hi int)
}

var gemmBatchPasses = sync.Pool{New: func() any {
	p := new(gemmBatchPass)
	p.run = p.products
	return p
}}

func (p *gemmBatchPass) products(lo, hi int) {
	for i := lo; i < hi; i++ {
		p.be.Sgemm(p.transA, p.transB, p.m, p.n, p.k, 1, p.a[i*p.sa:], p.lda, p.b[i*p.sb:], p.ldb, 0, p.c[i*p.sc:], p.ldc)
	}
}

// batchedGemm runs the products of g. With at least as many products as
// threads, and an even split or enough products that an uneven one costs
// little, the threads take disjoint runs of whole products, each product on
// a single-threaded twin of the backend; else the products run one after
// another, each threaded by the backend. Each product's arithmetic is the
// backend's either way, so a deterministic backend gives the same bits at
// every thread count.
func batchedGemm(c *Ctx, g gemmBatch) {
	if g.count == 0 {
		return
	}
	threads := threadsOf(c)
	if threads > 1 && g.count >= threads && (g.count%threads == 0 || g.count >= 4*threads) {
		if one := serialTwin(c.Backend); one != nil {
			p := gemmBatchPasses.Get().(*gemmBatchPass)
			p.gemmBatch, p.be = g, one
			parallel(threads, g.count, 1, p.run)
			p.gemmBatch, p.be = gemmBatch{}, nil
			gemmBatchPasses.Put(p)
			return
		}
	}
	for i := 0; i < g.count; i++ {
		c.Backend.Sgemm(g.transA, g.transB, g.m, g.n, g.k, 1, g.a[i*g.sa:], g.lda, g.b[i*g.sb:], g.ldb, 0, g.c[i*g.sc:], g.ldc)
	}
}

// serialTwins maps a backend to its single-threaded twin, kept for the
// life of the process (a process makes few backends) so that the twin's
// pools of scratch survive between passes.
var serialTwins sync.Map // Backend -> Backend

// serialTwin returns a single-threaded backend with be's arithmetic, to be
// called from inside a parallel chunk, or nil when there is none: a
// threaded backend called from a chunk would nest parallel calls, whose
// workers can end up all waiting for each other.
func serialTwin(be Backend) Backend {
	switch be.(type) {
	case *detGemm:
	case *openblasBackend:
		if openblasNative {
			return nil // OpenBLAS threads on its own: no single-threaded call
		}
	default:
		return nil // unknown (perhaps not even comparable) backends
	}
	if v, ok := serialTwins.Load(be); ok {
		return v.(Backend)
	}
	var one Backend = &openblasBackend{threads: 1}
	if b, ok := be.(*detGemm); ok {
		one = &detGemm{threads: 1, kern: b.kern, fast: b.fast}
	}
	v, _ := serialTwins.LoadOrStore(be, one)
	return v.(Backend)
}
