package nn

import (
	"fmt"
	"math"
	"os"

	"github.com/ppnode/ppnode/nn/internal/dnnl"
)

// # The fast path
//
// Built with the tag dnnl (cgo, Debian's libdnnl-dev), Conv2D, MaxPool2D
// and AvgPool2D run their passes through oneDNN's primitives, and
// BatchNorm, ReLU, Add and the stage's gradient sums through vectorised
// loops of ours (package nn/internal/dnnl), whenever the Ctx's backend is
// not deterministic. oneDNN picks its kernels
// by CPU model, and both split their work by thread count, so the bits are
// not reproducible; with a deterministic backend, or without the tag, the
// layers run their own loops, whose bits are what they always were.
//
// Threads: every pass of a stage runs on one OS thread kept for the
// purpose (team.go), and oneDNN and our loops thread with OpenMP over the
// whole batch from it, as PyTorch's do. libgomp keeps a team of threads per
// calling OS thread, and Go moves goroutines between threads, so calls from
// wherever a pass happens to run would start team after team, spinning
// against each other. PPNODE_DNNL_THREADS=split instead runs oneDNN
// single-threaded on one part of the batch per thread, on the shared worker
// goroutines (for comparison; slower, BENCHMARKS.md).
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
//
// A layer runs one pass at a time (as every layer with scratch of its own,
// BatchNorm's sums for one): the pass in progress lives in the layer. A
// primitive that fails to run retires its plan, and the layer's own loops
// take over.

// OneDNN reports whether this binary has the fast path: Conv2D and the
// pooling layers run through oneDNN, BatchNorm through vectorised loops, on
// non-deterministic backends.
const OneDNN = dnnl.Available

// dnnlTeam is false when PPNODE_DNNL_THREADS=split.
var dnnlTeam = os.Getenv("PPNODE_DNNL_THREADS") != "split"

// Describe names what computes on be: its GEMM backend, and "+onednn"
// when convolutions, pooling and BatchNorm take the fast path on it, as in
// "openblas+onednn".
func Describe(be Backend) string {
	if dnnl.Available && !be.Deterministic() {
		return be.Name() + "+onednn"
	}
	return be.Name()
}

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
	parts  []dnnlPart[P]
	omp    int     // oneDNN's OpenMP threads
	errs   []error // each part's error in the pass in progress
	failed bool    // a pass failed: the layer's own loops take over
}

// ok reports whether every part of the pass just run succeeded, and if
// not, retires the plan: oneDNN failing to run a primitive it made is not
// expected to heal, and the layer's own loops give the same results.
func (p *dnnlPlan[P]) ok() bool {
	for i, err := range p.errs {
		if err != nil {
			p.failed = true
			p.errs[i] = nil
		}
	}
	return !p.failed
}

// each runs fn on parts [lo, hi) of the plan, all in parallel.
func (p *dnnlPlan[P]) each(fn func(lo, hi int)) {
	if len(p.parts) == 1 {
		fn(0, 1)
		return
	}
	parallel(len(p.parts), len(p.parts), 1, fn)
}

type planKey struct {
	n, threads int
	team       bool
}

// dnnlPlans maps a batch size and thread count to its primitives, nil where
// oneDNN has none.
type dnnlPlans[P any] map[planKey]*dnnlPlan[P]

// get returns the plan for a batch of n in a pass in c, made by mk (for
// each part's size) on first use: on the team thread one part on c's
// threads, else a part per thread.
func (m *dnnlPlans[P]) get(n int, c *Ctx, mk func(n int) (*P, error)) *dnnlPlan[P] {
	threads := threadsOf(c)
	k := planKey{n, threads, c.team}
	if p, ok := (*m)[k]; ok {
		if p != nil && p.failed {
			return nil
		}
		return p
	}
	if *m == nil {
		*m = dnnlPlans[P]{}
	}
	p := &dnnlPlan[P]{omp: 1}
	parts := min(threads, n)
	if c.team {
		parts, p.omp = 1, threads
	}
	for i, lo := 0, 0; i < parts; i++ {
		size := n / parts
		if i < n%parts {
			size++
		}
		prim, err := mk(size)
		if err != nil {
			p = nil
			break
		}
		p.parts = append(p.parts, dnnlPart[P]{i: i, lo: lo, n: size, p: prim})
		lo += size
	}
	if p != nil {
		p.errs = make([]error, len(p.parts))
	}
	(*m)[k] = p
	return p
}

// dnnlConv is a Conv2D's oneDNN state: its plans, and the pass in progress,
// which the goroutines running its parts read and which is cleared when it
// returns. The functions that run parts are made once, so that a pass
// allocates nothing.
type dnnlConv struct {
	plans dnnlPlans[dnnl.Conv]

	cur          *dnnlPlan[dnnl.Conv]
	l            *Conv2D
	x, y, dy, dx []float32
	w, b, dw, db []float32
	in, out, omp int
	weights      bool // the backward pass computes the weight gradients
	fwdFn, bwdFn func(lo, hi int)
}

func (d *dnnlConv) reset() { d.plans = nil }

func (d *dnnlConv) plan(l *Conv2D, n int, c *Ctx) *dnnlPlan[dnnl.Conv] {
	return d.plans.get(n, c, func(n int) (*dnnl.Conv, error) {
		return dnnl.NewConv(dnnl.ConvGeom{
			N: n, IC: l.In, IH: l.h, IW: l.w, OC: l.Out, OH: l.ho, OW: l.wo,
			KH: l.KH, KW: l.KW, SH: l.SH, SW: l.SW, DH: l.DH, DW: l.DW,
			PadT: l.PadT, PadL: l.PadL, PadB: l.PadB, PadR: l.PadR, Groups: l.Groups, Bias: l.Bias,
		})
	})
}

// begin sets up a pass of l on plan p; end clears it.
func (d *dnnlConv) begin(l *Conv2D, p *dnnlPlan[dnnl.Conv]) {
	if d.fwdFn == nil {
		d.fwdFn, d.bwdFn = d.forwardParts, d.backwardParts
	}
	d.cur, d.l, d.omp = p, l, p.omp
	d.in, d.out = l.h*l.w*l.In, l.ho*l.wo*l.Out
	d.w, d.b, d.dw, d.db = F32(l.W.Value), nil, F32(l.W.Grad), nil
	if l.Bias {
		d.b, d.db = F32(l.B.Value), F32(l.B.Grad)
	}
}

func (d *dnnlConv) end() {
	d.cur, d.l = nil, nil
	d.x, d.y, d.dy, d.dx, d.w, d.b, d.dw, d.db = nil, nil, nil, nil, nil, nil, nil, nil
}

func (d *dnnlConv) forward(c *Ctx, l *Conv2D, x, y []float32, n int) bool {
	p := d.plan(l, n, c)
	if p == nil {
		return false
	}
	d.begin(l, p)
	d.x, d.y = x, y
	p.each(d.fwdFn)
	d.end()
	return p.ok()
}

func (d *dnnlConv) forwardParts(lo, hi int) {
	for i := lo; i < hi; i++ {
		pt := &d.cur.parts[i]
		a, b := pt.lo, pt.lo+pt.n
		d.cur.errs[i] = pt.p.Forward(d.omp, d.x[a*d.in:b*d.in], d.w, d.b, d.y[a*d.out:b*d.out])
	}
}

// backward adds the weight (and bias) gradients if weights is set and,
// unless dx is nil, writes the input gradient. The parts' weight gradients
// are added in part order once all are computed. A failure before that
// leaves the gradients as they were, for the layer's own loops; a failure
// while adding them would leave part of a sum, and panics.
func (d *dnnlConv) backward(c *Ctx, l *Conv2D, x, dy, dx []float32, n int, weights bool) bool {
	p := d.plan(l, n, c)
	if p == nil {
		return false
	}
	d.begin(l, p)
	defer d.end()
	d.x, d.dy, d.dx, d.weights = x, dy, dx, weights
	p.each(d.bwdFn)
	if !p.ok() {
		return false
	}
	if !weights {
		return true
	}
	for i := range p.parts {
		if err := p.parts[i].p.AddGrads(p.omp, d.dw, d.db); err != nil {
			panic(fmt.Sprintf("nn: %v (the weight gradients of a convolution are lost)", err))
		}
	}
	return true
}

func (d *dnnlConv) backwardParts(lo, hi int) {
	for i := lo; i < hi; i++ {
		pt := &d.cur.parts[i]
		a, b := pt.lo, pt.lo+pt.n
		xs, dys := d.x[a*d.in:b*d.in], d.dy[a*d.out:b*d.out]
		var err error
		if d.weights {
			err = pt.p.BackwardWeights(d.omp, xs, dys)
		}
		if err == nil && d.dx != nil {
			err = pt.p.BackwardData(d.omp, dys, d.w, d.dx[a*d.in:b*d.in])
		}
		d.cur.errs[i] = err
	}
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

// dnnlPool is a pooling layer's oneDNN state: its plans and the pass in
// progress (see dnnlConv).
type dnnlPool struct {
	plans dnnlPlans[dnnl.Pool]

	cur          *dnnlPlan[dnnl.Pool]
	x, y, dy, dx []float32
	ws           []int32
	in, out, per int
	fwdFn, bwdFn func(lo, hi int)
}

func (d *dnnlPool) reset() { d.plans = nil }

func (d *dnnlPool) plan(g *window, alg dnnl.PoolAlg, n int, c *Ctx) *dnnlPlan[dnnl.Pool] {
	return d.plans.get(n, c, func(n int) (*dnnl.Pool, error) {
		return dnnl.NewPool(dnnl.PoolGeom{
			N: n, C: g.c, IH: g.h, IW: g.w, OH: g.ho, OW: g.wo, KH: g.kh, KW: g.kw, SH: g.sh, SW: g.sw,
			PadT: g.pt, PadL: g.pl, PadB: g.pb, PadR: g.pr, Alg: alg,
		})
	})
}

// begin sets up a pass on plan p over the window g. The slot's int buffer
// 0 holds the parts' workspaces (max pooling's argmax), per int32s each,
// part i's at i·per.
func (d *dnnlPool) begin(s *Slot, g *window, p *dnnlPlan[dnnl.Pool]) {
	if d.fwdFn == nil {
		d.fwdFn, d.bwdFn = d.forwardParts, d.backwardParts
	}
	d.per = 0
	for _, pt := range p.parts {
		d.per = max(d.per, pt.p.Workspace())
	}
	d.cur, d.ws = p, s.Ints(0, d.per*len(p.parts))
	d.in, d.out = g.h*g.w*g.c, g.ho*g.wo*g.c
}

func (d *dnnlPool) end() {
	d.cur, d.x, d.y, d.dy, d.dx, d.ws = nil, nil, nil, nil, nil, nil
}

// forward writes y and the workspace its backward pass reads.
func (d *dnnlPool) forward(c *Ctx, s *Slot, g *window, alg dnnl.PoolAlg, x, y []float32, n int) bool {
	p := d.plan(g, alg, n, c)
	if p == nil {
		return false
	}
	d.begin(s, g, p)
	d.x, d.y = x, y
	p.each(d.fwdFn)
	d.end()
	return p.ok()
}

func (d *dnnlPool) forwardParts(lo, hi int) {
	for i := lo; i < hi; i++ {
		pt := &d.cur.parts[i]
		a, b := pt.lo, pt.lo+pt.n
		d.cur.errs[i] = pt.p.Forward(d.cur.omp, d.x[a*d.in:b*d.in], d.y[a*d.out:b*d.out], d.ws[i*d.per:(i+1)*d.per])
	}
}

func (d *dnnlPool) backward(c *Ctx, s *Slot, g *window, alg dnnl.PoolAlg, dy, dx []float32, n int) bool {
	p := d.plan(g, alg, n, c)
	if p == nil {
		return false
	}
	d.begin(s, g, p)
	d.dy, d.dx = dy, dx
	p.each(d.bwdFn)
	d.end()
	return p.ok()
}

func (d *dnnlPool) backwardParts(lo, hi int) {
	for i := lo; i < hi; i++ {
		pt := &d.cur.parts[i]
		a, b := pt.lo, pt.lo+pt.n
		d.cur.errs[i] = pt.p.Backward(d.cur.omp, d.dy[a*d.out:b*d.out], d.ws[i*d.per:(i+1)*d.per], d.dx[a*d.in:b*d.in])
	}
}

// dnnlAlg is the layer's oneDNN algorithm.
func (p *AvgPool2D) dnnlAlg() dnnl.PoolAlg {
	if p.CountIncludePad {
		return dnnl.PoolAvgIncludePad
	}
	return dnnl.PoolAvgExcludePad
}

// bnFast is a BatchNorm's pass in progress on the fast path: its tensors,
// which the goroutines running its chunks of rows read and which are
// cleared when it returns, and the functions that run chunks, made once so
// that a pass allocates nothing.
type bnFast struct {
	x, y, dy, dx                            []float32
	relu                                    bool      // the forward pass applies a ReLU
	out                                     []float32 // the backward pass's ReLU output, or nil
	shift, mean, inv, scale, bias, k, a, bb []float32
	parts                                   []float64 // 2 × C sums per chunk
	c, rows, chunks                         int
	statsFn, normFn, sumsFn, dxFn           func(lo, hi int)
}

// begin sets up a pass over x (rows of l.C channels) in chunks of rows, one
// per thread.
func (f *bnFast) begin(c *Ctx, l *BatchNorm, x []float32) {
	if f.statsFn == nil {
		f.statsFn, f.normFn, f.sumsFn, f.dxFn = f.stats, f.normalize, f.sums, f.inputGrad
	}
	f.x, f.c, f.rows = x, l.C, len(x)/l.C
	f.chunks = max(1, min(threadsOf(c), f.rows/64))
	if len(l.parts) < 2*f.chunks*f.c {
		l.parts = make([]float64, 2*f.chunks*f.c)
	}
	f.parts = l.parts[:2*f.chunks*f.c]
}

func (f *bnFast) end() {
	*f = bnFast{statsFn: f.statsFn, normFn: f.normFn, sumsFn: f.sumsFn, dxFn: f.dxFn}
}

// run runs a pass over every chunk, all in parallel: on the team thread
// team does (one C call, threaded by OpenMP), elsewhere fn on the worker
// goroutines, a call per chunk.
func (f *bnFast) run(c *Ctx, team func(), fn func(lo, hi int)) {
	switch {
	case c.team:
		team()
	case f.chunks == 1:
		fn(0, 1)
	default:
		parallel(f.chunks, f.chunks, 1, fn)
	}
}

// rowsOf returns chunk k's rows of v.
func (f *bnFast) rowsOf(v []float32, k int) []float32 {
	return v[k*f.rows/f.chunks*f.c : (k+1)*f.rows/f.chunks*f.c]
}

// outRows returns chunk k's rows of the ReLU output, nil without one.
func (f *bnFast) outRows(k int) []float32 {
	if f.out == nil {
		return nil
	}
	return f.rowsOf(f.out, k)
}

// sumsOf returns chunk k's two vectors of sums.
func (f *bnFast) sumsOf(k int) (s1, s2 []float64) {
	C := f.c
	return f.parts[2*k*C : (2*k+1)*C], f.parts[(2*k+1)*C : (2*k+2)*C]
}

func (f *bnFast) stats(lo, hi int) {
	for k := lo; k < hi; k++ {
		s1, s2 := f.sumsOf(k)
		dnnl.BNStats(f.rowsOf(f.x, k), f.c, f.shift, s1, s2)
	}
}

func (f *bnFast) normalize(lo, hi int) {
	for k := lo; k < hi; k++ {
		dnnl.BNNormalize(f.rowsOf(f.x, k), f.rowsOf(f.y, k), f.c, f.mean, f.scale, f.bias, f.relu)
	}
}

func (f *bnFast) sums(lo, hi int) {
	for k := lo; k < hi; k++ {
		s1, s2 := f.sumsOf(k)
		dnnl.BNGradSums(f.rowsOf(f.x, k), f.outRows(k), f.rowsOf(f.dy, k), f.c, f.mean, f.inv, s1, s2)
	}
}

func (f *bnFast) inputGrad(lo, hi int) {
	for k := lo; k < hi; k++ {
		dnnl.BNInputGrad(f.rowsOf(f.x, k), f.outRows(k), f.rowsOf(f.dy, k), f.rowsOf(f.dx, k), f.c, f.mean, f.inv, f.k, f.a, f.bb)
	}
}

// total returns the sums of channel j over all chunks.
func (f *bnFast) total(j int) (s1, s2 float64) {
	C := f.c
	for k := 0; k < f.chunks; k++ {
		s1 += f.parts[2*k*C+j]
		s2 += f.parts[(2*k+1)*C+j]
	}
	return s1, s2
}

// forwardFast is Forward on the fast path: the same computation, the
// statistics summed in double around the first row (one pass over x), in
// chunks of rows on all threads; with relu, y is max(y, 0).
func (l *BatchNorm) forwardFast(c *Ctx, x, y, mean, inv, scale []float32, relu bool) {
	f := &l.fast
	f.begin(c, l, x)
	defer f.end()
	C, rows := f.c, f.rows
	rm, rv := F32(l.RunMean.Value), F32(l.RunVar.Value)
	if c.Train {
		clear(f.parts)
		f.shift = x[:C]
		f.run(c, func() { dnnl.BNStatsTeam(f.chunks, x, C, f.shift, f.parts) }, f.statsFn)
		R := float64(rows)
		m := l.Momentum
		for j := 0; j < C; j++ {
			s1, s2 := f.total(j)
			d := s1 / R
			mu := float64(f.shift[j]) + d
			v := max(s2/R-d*d, 0)
			mean[j] = float32(mu)
			inv[j] = float32(1 / math.Sqrt(v+l.Eps))
			unbiased := v
			if rows > 1 {
				unbiased = v * R / (R - 1)
			}
			if !c.Recompute {
				rm[j] = float32((1-m)*float64(rm[j]) + m*mu)
				rv[j] = float32((1-m)*float64(rv[j]) + m*unbiased)
			}
		}
	} else {
		for j := range mean {
			mean[j] = rm[j]
			inv[j] = float32(1 / math.Sqrt(float64(rv[j])+l.Eps))
		}
	}
	w := F32(l.Weight.Value)
	for j := range scale {
		scale[j] = inv[j] * w[j]
	}
	f.y, f.mean, f.scale, f.bias, f.relu = y, mean, scale, F32(l.Bias.Value), relu
	f.run(c, func() { dnnl.BNNormalizeTeam(f.chunks, x, y, C, mean, scale, f.bias, relu) }, f.normFn)
}

// backwardFast is Backward on the fast path; dx is nil when the input
// needs no gradient. Unless y is nil, dy is the gradient of max(y, 0), the
// ReLU the forward pass applied, and counts as 0 where y ≤ 0. k, a and bb
// are scratch vectors of C values.
func (l *BatchNorm) backwardFast(c *Ctx, x, y, dy, dx, mean, inv, k, a, bb []float32) {
	f := &l.fast
	f.begin(c, l, x)
	defer f.end()
	clear(f.parts)
	f.dy, f.out, f.mean, f.inv = dy, y, mean, inv
	f.run(c, func() { dnnl.BNGradSumsTeam(f.chunks, x, y, dy, f.c, mean, inv, f.parts) }, f.sumsFn)
	gw, gb := F32(l.Weight.Grad), F32(l.Bias.Grad)
	w := F32(l.Weight.Value)
	R := float64(f.rows)
	for j := 0; j < f.c; j++ {
		sdy, sdyx := f.total(j)
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
	f.dx, f.k, f.a, f.bb = dx, k, a, bb
	f.run(c, func() { dnnl.BNInputGradTeam(f.chunks, x, y, dy, dx, f.c, mean, inv, k, a, bb) }, f.dxFn)
}
