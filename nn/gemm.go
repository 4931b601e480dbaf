package nn

import (
	"math"
	"sync"

	"github.com/ppnode/ppnode/nn/internal/sgemm"
)

// # The deterministic GEMM
//
// detGemm is the deterministic backend. Its arithmetic is fixed: every
// element of C is computed as
//
//	c = 0 (beta = 0), c (beta = 1) or c·beta (otherwise)
//	for l = 0, 1, ..., k-1:
//	    s = alpha·a_il                 (rounded to float32)
//	    if a_il ≠ 0 and s ≠ 0:
//	        c = (b_lj·s) + c           (product rounded, then sum rounded)
//
// with nothing fused, in ascending l. This is the chain ppnode's first
// deterministic backend computed (a driver over gonum's Saxpy, which rounds
// alpha·a_il once and adds x·alpha to y in SSE), so fingerprints of
// deterministic runs did not change when it was replaced. No blocking,
// thread count, SIMD width or CPU model changes an element's chain, so the
// bits are the same on amd64 and arm64.
//
// The kernels (package nn/internal/sgemm) are BLIS-style: a micro-kernel
// keeps an mr × nr tile of C in vector registers, the lanes holding
// different columns j, and reads a panel of nr columns of B: B itself, row
// after row, or a copy packed k × nr where B is transposed or the panel is
// the last, narrower one. For each l it broadcasts s for each of the mr rows,
// multiplies the panel's row by it (VMULPS) and adds the product to the
// accumulator (VADDPS): never a fused multiply-add, and never a sum across
// lanes. amd64 runs an 8×32 tile with AVX-512F (8×16 for a panel of at most
// 16 columns) or a 6×16 tile with AVX2, arm64 an 8×8 tile in NEON, other
// CPUs the same arithmetic in Go; the CPU is asked at run time. The k loop is
// split into blocks of at most gemmMaxKC; a block starts from the C that the
// previous block stored, which changes no rounding. Threads take disjoint
// blocks of rows or columns of C.
//
// The kernels do not skip products whose s is zero, as the chain does. For a
// finite b_lj the product is then ±0, and c + ±0 = c unless c is -0 (the sum
// -0 + +0 is +0), or c is a signalling NaN (which the add quiets); a chain
// that starts from neither never reaches one. For an infinite or NaN b_lj
// the product is an infinity or a NaN (a NaN where s is 0), and the
// kernel's c stays one to the end of the block. So a kernel gives up on a
// tile, having written nothing, when a value of C it loads is -0 or a
// signalling NaN or a value it would store is an infinity or a NaN, and the
// tile is computed with [gemmCall.reference], the chain written out in Go.
// Both are rare: a diverged run, or a C that arrives holding -0. NaN payloads follow SSE's
// first-source rule on every path (chainStep); the default NaN that 0·∞ or
// ∞-∞ makes is the CPU's own, so NaN bits can differ between amd64 and
// arm64.

// gemmMaxKC bounds the length of a k block. One block covers the k of
// most products in ppnode, so a panel of B that needs packing is packed once.
const gemmMaxKC = 512

// gemmParallelWork is the fewest multiply-adds worth more than one thread.
const gemmParallelWork = 1 << 17

// gemmPackBudget is the number of floats of B in a column block (512 KiB):
// the block of B the micro-kernels sweep, kept in the L2 cache.
const gemmPackBudget = 128 << 10

// detGemm is the deterministic backend ("ppnode-det"; NewBackend also
// accepts "gonum", its name while it drove gonum's Saxpy), and with fast
// set the default one ("ppnode"): the same GEMM, faster than OpenBLAS on
// every shape of ppnode's models here (BENCHMARKS.md), which does not
// claim determinism so that the layers around it take their fast paths
// (oneDNN convolutions, threaded reductions).
type detGemm struct {
	threads int
	kern    *sgemm.Kernel
	fast    bool
	bufs    sync.Pool // *gemmBuf
	calls   sync.Pool // *gemmCall
}

func newDetGemm(threads int) (Backend, error) {
	return &detGemm{threads: threads, kern: sgemm.Kernels()[0]}, nil
}

func newFastGemm(threads int) (Backend, error) {
	return &detGemm{threads: threads, kern: sgemm.Kernels()[0], fast: true}, nil
}

func (g *detGemm) Name() string {
	if g.fast {
		return "ppnode"
	}
	return detBackend
}

func (g *detGemm) Deterministic() bool { return !g.fast }
func (g *detGemm) Threads() int        { return g.threads }

// gemmBuf is one thread's scratch: packed B, packed scalars, an edge tile,
// the panels of a block.
type gemmBuf struct {
	q, p, tile []float32
	panels     []panel
}

// panel is nr columns of op(B) from column j for a k block, read by kern at
// q[l·ql + j'], in place or packed (ql = nr); cols of them are C's.
type panel struct {
	kern    *sgemm.Kernel
	q       *float32
	ql      int
	j, cols int
}

func (g *detGemm) buf() *gemmBuf {
	if b, ok := g.bufs.Get().(*gemmBuf); ok {
		return b
	}
	return &gemmBuf{}
}

func grow(s []float32, n int) []float32 {
	if cap(s) < n {
		return make([]float32, n)
	}
	return s[:n]
}

// gemmCall is one product: the arguments of Sgemm and its blocking.
type gemmCall struct {
	g              *detGemm
	transA, transB bool
	m, n, k        int
	alpha, beta    float32
	a, b, c        []float32
	lda, ldb, ldc  int
	kc, nc         int // k block, column block
	mr, nr         int
	kern           *sgemm.Kernel
	directA        bool // the kernel reads A in place, with strides (alpha = 1)

	// The work of a thread, made once per gemmCall so that a product
	// allocates nothing: rows or columns of tiles, or rows of C.
	tileRows, tileCols, refRows func(lo, hi int)
}

func (g *detGemm) newCall() *gemmCall {
	if x, ok := g.calls.Get().(*gemmCall); ok {
		return x
	}
	x := &gemmCall{g: g}
	x.tileRows = func(lo, hi int) { x.region(lo*x.mr, min(hi*x.mr, x.m), 0, x.n) }
	x.tileCols = func(lo, hi int) { x.region(0, x.m, lo*x.nr, min(hi*x.nr, x.n)) }
	x.refRows = func(lo, hi int) { x.reference(lo, hi, 0, x.n, 0, x.k, true) }
	return x
}

func (g *detGemm) Sgemm(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	if m < 0 || n < 0 || k < 0 {
		panic("nn: negative GEMM dimension")
	}
	if m == 0 || n == 0 {
		return
	}
	checkMatrix("C", c, m, n, ldc)
	if k == 0 || alpha == 0 {
		// The chain is empty: only beta.
		scaleRows(c, m, n, ldc, beta)
		return
	}
	if transA {
		checkMatrix("A", a, k, m, lda)
	} else {
		checkMatrix("A", a, m, k, lda)
	}
	if transB {
		checkMatrix("B", b, n, k, ldb)
	} else {
		checkMatrix("B", b, k, n, ldb)
	}
	kern := g.kern
	x := g.newCall()
	x.kern, x.transA, x.transB, x.m, x.n, x.k = kern, transA, transB, m, n, k
	x.alpha, x.beta, x.a, x.b, x.c, x.lda, x.ldb, x.ldc = alpha, beta, a, b, c, lda, ldb, ldc
	x.mr, x.nr = kern.MR, kern.NR
	blocks := (k + gemmMaxKC - 1) / gemmMaxKC
	x.kc = (k + blocks - 1) / blocks
	x.nc = max(kern.NR, gemmPackBudget/x.kc/kern.NR*kern.NR)
	x.directA = alpha == 1 && kern.Strided

	rowTiles := (m + x.mr - 1) / x.mr
	colTiles := (n + x.nr - 1) / x.nr
	threads := g.threads
	if float64(m)*float64(n)*float64(k) < gemmParallelWork {
		threads = 1
	}
	// Split C over the dimension whose split reads less: by rows every
	// thread reads all of B (k×n), by columns all of A.
	byRows := m >= n && rowTiles >= threads || colTiles < threads && rowTiles > colTiles
	switch {
	case math.IsInf(float64(alpha), 0) || math.IsNaN(float64(alpha)):
		// s is not ±0 where a_il is 0, and the chain skips those products.
		parallel(threads, m, 1, x.refRows)
	case byRows:
		parallel(threads, rowTiles, 1, x.tileRows)
	default:
		parallel(threads, colTiles, 1, x.tileCols)
	}
	x.a, x.b, x.c = nil, nil, nil
	g.calls.Put(x)
}

// checkMatrix panics unless s holds a rows×cols matrix with leading
// dimension ld (the kernels read it without bounds checks).
func checkMatrix(name string, s []float32, rows, cols, ld int) {
	if ld < max(1, cols) {
		panic("nn: GEMM: bad leading dimension of " + name)
	}
	if rows > 0 && cols > 0 && len(s) < (rows-1)*ld+cols {
		panic("nn: GEMM: " + name + " is too short")
	}
}

// scaleRows applies beta to C as the chain does: 0 clears, 1 keeps.
func scaleRows(c []float32, m, n, ldc int, beta float32) {
	if beta == 1 {
		return
	}
	for i := 0; i < m; i++ {
		row := c[i*ldc : i*ldc+n]
		if beta == 0 {
			clear(row)
			continue
		}
		for j := range row {
			row[j] *= beta
		}
	}
}

// region computes rows [i0, i1) and columns [j0, j1) of C.
func (x *gemmCall) region(i0, i1, j0, j1 int) {
	buf := x.g.buf()
	defer x.g.bufs.Put(buf)
	mr := x.mr
	buf.p = grow(buf.p, mr*x.kc)
	buf.tile = grow(buf.tile, mr*x.nr)
	for jc := j0; jc < j1; jc += x.nc {
		nc := min(x.nc, j1-jc)
		for pc := 0; pc < x.k; pc += x.kc {
			kc := min(x.kc, x.k-pc)
			panels := x.panels(buf, pc, kc, jc, nc)
			flags := sgemm.Load
			if pc == 0 {
				switch x.beta {
				case 0:
					flags = 0
				case 1:
				default:
					flags = sgemm.Load | sgemm.Scale
				}
			}
			for ir := i0; ir < i1; ir += mr {
				rows := min(mr, i1-ir)
				var p []float32
				var pl, pr int
				if x.directA && rows == mr && x.transA {
					p, pl, pr = x.a[pc*x.lda+ir:], x.lda, 1
				} else if x.directA && rows == mr {
					p, pl, pr = x.a[ir*x.lda+pc:], 1, x.lda
				} else {
					x.packA(buf.p, ir, rows, pc, kc)
					p, pl, pr = buf.p, mr, 1
				}
				for _, pn := range panels {
					kern, nr, jr, cols := pn.kern, pn.kern.NR, pn.j, pn.cols
					var special bool
					if rows == mr && cols == nr {
						special = kern.Tile(kc, &p[0], pl, pr, pn.q, pn.ql, &x.c[ir*x.ldc+jr], x.ldc, x.beta, flags)
					} else {
						t := buf.tile[:mr*nr]
						if flags&sgemm.Load != 0 {
							clear(t)
							for r := 0; r < rows; r++ {
								copy(t[r*nr:r*nr+cols], x.c[(ir+r)*x.ldc+jr:])
							}
						}
						special = kern.Tile(kc, &p[0], pl, pr, pn.q, pn.ql, &t[0], nr, x.beta, flags)
						if !special {
							for r := 0; r < rows; r++ {
								copy(x.c[(ir+r)*x.ldc+jr:(ir+r)*x.ldc+jr+cols], t[r*nr:])
							}
						}
					}
					if special {
						x.reference(ir, ir+rows, jr, jr+cols, pc, pc+kc, pc == 0)
					}
				}
			}
		}
	}
}

// panels cuts columns [j0, j0+nc) of rows [l0, l0+kc) of op(B) into
// panels: full panels of B read in place, the others packed into buf.q
// (transposed, or the last, padded with zeros). A last panel of at most
// NR/2 columns goes to the narrow kernel, if there is one.
func (x *gemmCall) panels(buf *gemmBuf, l0, kc, j0, nc int) []panel {
	ps := buf.panels[:0]
	packed := 0
	for j := j0; j < j0+nc; {
		kern := x.kern
		cols := min(kern.NR, j0+nc-j)
		if cols <= kern.NR/2 && kern.Narrow != nil {
			kern = kern.Narrow
		}
		if x.transB || cols < kern.NR {
			packed += kc * kern.NR
		}
		ps = append(ps, panel{kern: kern, j: j, cols: cols})
		j += cols
	}
	buf.panels = ps
	buf.q = grow(buf.q, packed)
	off := 0
	for i := range ps {
		pn := &ps[i]
		nr := pn.kern.NR
		if !x.transB && pn.cols == nr {
			pn.q, pn.ql = &x.b[l0*x.ldb+pn.j], x.ldb
			continue
		}
		d := buf.q[off : off+kc*nr]
		off += kc * nr
		pn.q, pn.ql = &d[0], nr
		if pn.cols == nr {
			pn.kern.PackT(kc, x.b[pn.j*x.ldb+l0:], x.ldb, d)
			continue
		}
		clear(d)
		for l := 0; l < kc; l++ {
			row := d[l*nr : l*nr+pn.cols]
			for jj := range row {
				if x.transB {
					row[jj] = x.b[(pn.j+jj)*x.ldb+l0+l]
				} else {
					row[jj] = x.b[(l0+l)*x.ldb+pn.j+jj]
				}
			}
		}
	}
	return ps
}

// packA packs s = alpha·a for rows [i0, i0+rows) and l in [l0, l0+kc),
// dst[l·mr + r], rows past the end zero.
func (x *gemmCall) packA(dst []float32, i0, rows, l0, kc int) {
	mr, alpha := x.mr, x.alpha
	dst = dst[:kc*mr]
	if rows < mr {
		clear(dst)
	}
	if x.transA { // op(A)'s rows are contiguous in each row of A
		for l := 0; l < kc; l++ {
			src := x.a[(l0+l)*x.lda+i0 : (l0+l)*x.lda+i0+rows]
			d := dst[l*mr : l*mr+rows]
			for r, v := range src {
				d[r] = alpha * v
			}
		}
		return
	}
	for r := 0; r < rows; r++ {
		i := i0 + r
		src := x.a[i*x.lda+l0 : i*x.lda+l0+kc]
		for l, v := range src {
			dst[l*mr+r] = alpha * v
		}
	}
}

// reference runs the chain, products skipped as it says, for rows [i0, i1),
// columns [j0, j1) and l in [l0, l1), applying beta first if withBeta.
func (x *gemmCall) reference(i0, i1, j0, j1, l0, l1 int, withBeta bool) {
	for i := i0; i < i1; i++ {
		row := x.c[i*x.ldc+j0 : i*x.ldc+j1]
		if withBeta {
			if x.beta == 0 {
				clear(row)
			} else if x.beta != 1 {
				for j := range row {
					row[j] *= x.beta
				}
			}
		}
		for l := l0; l < l1; l++ {
			var av float32
			if x.transA {
				av = x.a[l*x.lda+i]
			} else {
				av = x.a[i*x.lda+l]
			}
			if av == 0 {
				continue
			}
			s := x.alpha * av
			if s == 0 {
				continue
			}
			if x.transB {
				for j := range row {
					row[j] = chainStep(row[j], x.b[(j0+j)*x.ldb+l], s)
				}
			} else {
				brow := x.b[l*x.ldb+j0 : l*x.ldb+j1]
				for j, bv := range brow {
					row[j] = chainStep(row[j], bv, s)
				}
			}
		}
	}
}

// chainStep is c + b·s rounded as the kernels round it, and with their NaN
// payloads: a NaN product wins over a NaN c, a NaN b over a NaN s (the
// first source of SSE's MULPS and ADDPS; Go would pick either).
func chainStep(c, b, s float32) float32 {
	p := float32(b * s)
	if p != p {
		if b != b {
			return b + 0 // quieted
		}
		return p
	}
	return p + c
}
