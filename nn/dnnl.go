package nn

import (
	"math"
	"os"

	"github.com/ppnode/ppnode/nn/internal/dnnl"
)

// # The fast path
//
// Built with the tag dnnl (cgo, Debian's libdnnl-dev), Conv2D, MaxPool2D
// and AvgPool2D run their passes through oneDNN's primitives, and
// BatchNorm through vectorised loops of ours (package nn/internal/dnnl),
// whenever the Ctx's backend is not deterministic. oneDNN picks its kernels
// by CPU model, and both split their work by thread count, so the bits are
// not reproducible; with a deterministic backend, or without the tag, the
// layers run their own loops, whose bits are what they always were.
//
// Threads: oneDNN runs single-threaded and a pass is split by samples into
// one part per thread, run on the shared worker goroutines, for the reason
// the OpenBLAS backend gives: OpenMP's worker threads spin between calls
// (and inside oneDNN's kernels, at barriers) and fight the layers'
// goroutines, and any other process, for the CPUs. PPNODE_DNNL_THREADS=native
// lets oneDNN thread with OpenMP instead, over the whole batch (for
// comparison).
//
// A layer makes its primitives on the first pass of each batch size and
// keeps them (so uneven micro-batches have a set each); a geometry oneDNN
// has no kernel for is remembered and takes the layer's own path. The
// primitives hold no tensor of a pass: what a backward pass needs of its
// forward pass (max pooling's workspace, the batch statistics) lives in the
// Slot. Each primitive keeps the weights reordered into oneDNN's layout
// with a copy of the weights they were made from, and reorders again when a
// pass's weights differ from the copy (a memcmp): the optimizer updates
// weights in place, and this sees every update without being told.

// OneDNN reports whether this binary has the fast path: Conv2D and the
// pooling layers run through oneDNN, BatchNorm through vectorised loops, on
// non-deterministic backends.
const OneDNN = dnnl.Available

var dnnlNative = os.Getenv("PPNODE_DNNL_THREADS") == "native"

// fastPath reports whether a pass in c takes the fast path.
func fastPath(c *Ctx) bool {
	return dnnl.Available && c != nil && c.Backend != nil && !c.Backend.Deterministic()
}

// dnnlPart is part i of a batch: samples [lo, lo+n) and their primitive.
type dnnlPart[P any] struct {
	i, lo, n int
	p        *P
}

// dnnlPlan is a layer's primitives for one batch size and thread count.
type dnnlPlan[P any] struct {
	parts []dnnlPart[P]
	omp   int // oneDNN's OpenMP threads
}

// run calls fn on every part, the parts in parallel.
func (p *dnnlPlan[P]) run(fn func(pt *dnnlPart[P])) {
	if len(p.parts) == 1 {
		fn(&p.parts[0])
		return
	}
	parallel(len(p.parts), len(p.parts), 1, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			fn(&p.parts[i])
		}
	})
}

type planKey struct{ n, threads int }

// dnnlPlans maps a batch size and thread count to its primitives, nil where
// oneDNN has none.
type dnnlPlans[P any] map[planKey]*dnnlPlan[P]

// get returns the plan for a batch of n on threads threads, made by mk (for
// each part's size) on first use.
func (m *dnnlPlans[P]) get(n, threads int, mk func(n int) (*P, error)) *dnnlPlan[P] {
	k := planKey{n, threads}
	if p, ok := (*m)[k]; ok {
		return p
	}
	if *m == nil {
		*m = dnnlPlans[P]{}
	}
	p := &dnnlPlan[P]{omp: 1}
	parts := min(threads, n)
	if dnnlNative {
		parts, p.omp = 1, threads
	}
	for i, lo := 0, 0; i < parts; i++ {
		size := n/parts + btoi(i < n%parts)
		prim, err := mk(size)
		if err != nil {
			p = nil
			break
		}
		p.parts = append(p.parts, dnnlPart[P]{i: i, lo: lo, n: size, p: prim})
		lo += size
	}
	(*m)[k] = p
	return p
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// dnnlConv is a Conv2D's oneDNN state.
type dnnlConv struct{ plans dnnlPlans[dnnl.Conv] }

func (d *dnnlConv) reset() { d.plans = nil }

func (d *dnnlConv) plan(l *Conv2D, n, threads int) *dnnlPlan[dnnl.Conv] {
	return d.plans.get(n, threads, func(n int) (*dnnl.Conv, error) {
		return dnnl.NewConv(dnnl.ConvGeom{
			N: n, IC: l.In, IH: l.h, IW: l.w, OC: l.Out, OH: l.ho, OW: l.wo,
			KH: l.KH, KW: l.KW, SH: l.SH, SW: l.SW, DH: l.DH, DW: l.DW,
			PadT: l.PadT, PadL: l.PadL, PadB: l.PadB, PadR: l.PadR, Groups: l.Groups, Bias: l.Bias,
		})
	})
}

func (d *dnnlConv) forward(c *Ctx, l *Conv2D, x, y []float32, n int) bool {
	p := d.plan(l, n, threadsOf(c))
	if p == nil {
		return false
	}
	var b []float32
	if l.Bias {
		b = F32(l.B.Value)
	}
	w := F32(l.W.Value)
	in, out := l.h*l.w*l.In, l.ho*l.wo*l.Out
	p.run(func(pt *dnnlPart[dnnl.Conv]) {
		pt.p.Forward(p.omp, x[pt.lo*in:(pt.lo+pt.n)*in], w, b, y[pt.lo*out:(pt.lo+pt.n)*out])
	})
	return true
}

// backward adds the weight (and bias) gradients and, unless dx is nil,
// writes the input gradient. The parts' weight gradients are added in part
// order once all are computed.
func (d *dnnlConv) backward(c *Ctx, l *Conv2D, x, dy, dx []float32, n int) bool {
	p := d.plan(l, n, threadsOf(c))
	if p == nil {
		return false
	}
	w := F32(l.W.Value)
	in, out := l.h*l.w*l.In, l.ho*l.wo*l.Out
	p.run(func(pt *dnnlPart[dnnl.Conv]) {
		xs, dys := x[pt.lo*in:(pt.lo+pt.n)*in], dy[pt.lo*out:(pt.lo+pt.n)*out]
		pt.p.BackwardWeights(p.omp, xs, dys)
		if dx != nil {
			pt.p.BackwardData(p.omp, dys, w, dx[pt.lo*in:(pt.lo+pt.n)*in])
		}
	})
	var db []float32
	if l.Bias {
		db = F32(l.B.Grad)
	}
	for i := range p.parts {
		p.parts[i].p.AddGrads(p.omp, F32(l.W.Grad), db)
	}
	return true
}

// impl names the kernels oneDNN chose for batch size n (forward, backward
// data, backward weights) when the first plan of that size was made, empty
// if there is none.
func (d *dnnlConv) impl(n int) [3]string {
	for k, p := range d.plans {
		if k.n == n && p != nil {
			return p.parts[0].p.Impl()
		}
	}
	return [3]string{}
}

// dnnlPool is a pooling layer's oneDNN state.
type dnnlPool struct{ plans dnnlPlans[dnnl.Pool] }

func (d *dnnlPool) reset() { d.plans = nil }

func (d *dnnlPool) plan(g *window, alg dnnl.PoolAlg, n, threads int) *dnnlPlan[dnnl.Pool] {
	return d.plans.get(n, threads, func(n int) (*dnnl.Pool, error) {
		return dnnl.NewPool(dnnl.PoolGeom{
			N: n, C: g.c, IH: g.h, IW: g.w, OH: g.ho, OW: g.wo, KH: g.kh, KW: g.kw, SH: g.sh, SW: g.sw,
			PadT: g.pt, PadL: g.pl, PadB: g.pb, PadR: g.pr, Alg: alg,
		})
	})
}

// workspace returns the slot's int buffer 0, which holds the workspace of
// the plan's parts (max pooling's argmax), per int32s each, part i's at
// i·per.
func (p *dnnlPlan[P]) workspace(s *Slot, per int) []int32 {
	return s.Ints(0, per*len(p.parts))
}

// poolWorkspace is the largest workspace of p's parts.
func poolWorkspace(p *dnnlPlan[dnnl.Pool]) int {
	per := 0
	for _, pt := range p.parts {
		per = max(per, pt.p.Workspace())
	}
	return per
}

// forward writes y and the workspace its backward pass reads into the
// slot's int buffer 0.
func (d *dnnlPool) forward(c *Ctx, s *Slot, g *window, alg dnnl.PoolAlg, x, y []float32, n int) bool {
	p := d.plan(g, alg, n, threadsOf(c))
	if p == nil {
		return false
	}
	per := poolWorkspace(p)
	ws := p.workspace(s, per)
	in, out := g.h*g.w*g.c, g.ho*g.wo*g.c
	p.run(func(pt *dnnlPart[dnnl.Pool]) {
		pt.p.Forward(p.omp, x[pt.lo*in:(pt.lo+pt.n)*in], y[pt.lo*out:(pt.lo+pt.n)*out], ws[pt.i*per:(pt.i+1)*per])
	})
	return true
}

func (d *dnnlPool) backward(c *Ctx, s *Slot, g *window, alg dnnl.PoolAlg, dy, dx []float32, n int) bool {
	p := d.plan(g, alg, n, threadsOf(c))
	if p == nil {
		return false
	}
	per := poolWorkspace(p)
	ws := p.workspace(s, per)
	in, out := g.h*g.w*g.c, g.ho*g.wo*g.c
	p.run(func(pt *dnnlPart[dnnl.Pool]) {
		pt.p.Backward(p.omp, dy[pt.lo*out:(pt.lo+pt.n)*out], ws[pt.i*per:(pt.i+1)*per], dx[pt.lo*in:(pt.lo+pt.n)*in])
	})
	return true
}

// dnnlAlg is the layer's oneDNN algorithm.
func (p *AvgPool2D) dnnlAlg() dnnl.PoolAlg {
	if p.CountIncludePad {
		return dnnl.PoolAvgIncludePad
	}
	return dnnl.PoolAvgExcludePad
}

// bnChunked cuts rows into chunks and runs fn on each (chunk k, rows
// [lo, hi)), the chunks in parallel.
func bnChunked(c *Ctx, rows, chunks int, fn func(k, lo, hi int)) {
	parallel(chunks, chunks, 1, func(k0, k1 int) {
		for k := k0; k < k1; k++ {
			fn(k, k*rows/chunks, (k+1)*rows/chunks)
		}
	})
}

// fastChunks is the number of row chunks of a fast-path pass over rows.
func (l *BatchNorm) fastChunks(c *Ctx, rows int) int {
	chunks := max(1, min(threadsOf(c), rows/64))
	if len(l.parts) < 2*chunks*l.C {
		l.parts = make([]float64, 2*chunks*l.C)
	}
	return chunks
}

// forwardFast is Forward on the fast path: the same computation, the
// statistics summed in double around the first row (one pass), in chunks
// of rows on all threads.
func (l *BatchNorm) forwardFast(c *Ctx, x, y, mean, inv, scale []float32) {
	C := l.C
	rows := len(x) / C
	chunks := l.fastChunks(c, rows)
	rm, rv := F32(l.RunMean.Value), F32(l.RunVar.Value)
	if c.Train {
		parts := l.parts[:2*chunks*C]
		clear(parts)
		shift := x[:C]
		bnChunked(c, rows, chunks, func(k, lo, hi int) {
			dnnl.BNStats(x[lo*C:hi*C], C, shift, parts[2*k*C:(2*k+1)*C], parts[(2*k+1)*C:(2*k+2)*C])
		})
		R := float64(rows)
		m := l.Momentum
		for j := 0; j < C; j++ {
			var s1, s2 float64
			for k := 0; k < chunks; k++ {
				s1 += parts[2*k*C+j]
				s2 += parts[(2*k+1)*C+j]
			}
			d := s1 / R
			mu := float64(shift[j]) + d
			v := max(s2/R-d*d, 0)
			mean[j] = float32(mu)
			inv[j] = float32(1 / math.Sqrt(v+l.Eps))
			unbiased := v
			if rows > 1 {
				unbiased = v * R / (R - 1)
			}
			rm[j] = float32((1-m)*float64(rm[j]) + m*mu)
			rv[j] = float32((1-m)*float64(rv[j]) + m*unbiased)
		}
	} else {
		for j := range mean {
			mean[j] = rm[j]
			inv[j] = float32(1 / math.Sqrt(float64(rv[j])+l.Eps))
		}
	}
	w, b := F32(l.Weight.Value), F32(l.Bias.Value)
	for j := range scale {
		scale[j] = inv[j] * w[j]
	}
	bnChunked(c, rows, chunks, func(k, lo, hi int) {
		dnnl.BNNormalize(x[lo*C:hi*C], y[lo*C:hi*C], C, mean, scale, b)
	})
}

// backwardFast is Backward on the fast path; dx is nil when the input
// needs no gradient. k, a and bb are scratch vectors of C values.
func (l *BatchNorm) backwardFast(c *Ctx, x, dy, dx, mean, inv, k, a, bb []float32) {
	C := l.C
	rows := len(x) / C
	chunks := l.fastChunks(c, rows)
	parts := l.parts[:2*chunks*C]
	clear(parts)
	bnChunked(c, rows, chunks, func(k, lo, hi int) {
		dnnl.BNGradSums(x[lo*C:hi*C], dy[lo*C:hi*C], C, mean, inv, parts[2*k*C:(2*k+1)*C], parts[(2*k+1)*C:(2*k+2)*C])
	})
	gw, gb := F32(l.Weight.Grad), F32(l.Bias.Grad)
	w := F32(l.Weight.Value)
	R := float64(rows)
	for j := 0; j < C; j++ {
		var sdy, sdyx float64
		for q := 0; q < chunks; q++ {
			sdy += parts[2*q*C+j]
			sdyx += parts[(2*q+1)*C+j]
		}
		gw[j] += float32(sdyx)
		gb[j] += float32(sdy)
		k[j] = w[j] * inv[j]
		if c.Train {
			a[j] = float32(sdy / R)
			bb[j] = float32(sdyx / R)
		} else {
			a[j], bb[j] = 0, 0
		}
	}
	if dx == nil {
		return
	}
	bnChunked(c, rows, chunks, func(q, lo, hi int) {
		dnnl.BNInputGrad(x[lo*C:hi*C], dy[lo*C:hi*C], dx[lo*C:hi*C], C, mean, inv, k, a, bb)
	})
}
