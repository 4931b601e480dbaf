package nn

import (
	"fmt"
	"math"
	"sync"
)

// LayerNorm normalises every row of the last per-sample axis (size D) to
// zero mean and unit variance, y = (x−mean)/√(var+Eps)·w + b with the
// biased variance, as torch.nn.functional.layer_norm over the last axis.
// Without NoAffine it has "weight" [D] (ones) and "bias" [D] (zeros).
//
// Each row's mean and variance come from float64 sums in row order of
// x−x₀ and (x−x₀)², x₀ the row's first value: shifted by x₀, the variance
// S₂/n − (S₁/n)² loses at most a factor n of float64's precision (no
// value lies farther than √(n−1) standard deviations from the mean), far
// below float32's. Rows are independent, so the rows of a pass split over
// threads without changing a bit. On amd64 with AVX2 the loops run in
// assembly (norm_layer_amd64.s) that gives their bits: the forward sums of
// eight rows at a time in vector lanes, the rest along the rows.
type LayerNorm struct {
	Eps      float64
	NoAffine bool
	D        int    // size of the last axis, set by Build (which checks a preset one)
	W, B     *Param // nil with NoAffine
}

func (l *LayerNorm) Kind() string { return "layernorm" }

func (l *LayerNorm) Build(in [][]int) ([]int, error) {
	out, err := rowInput(in)
	if err != nil {
		return nil, err
	}
	if l.Eps < 0 || math.IsNaN(l.Eps) {
		return nil, fmt.Errorf("eps %v is negative", l.Eps)
	}
	last := out[len(out)-1]
	if l.D > 0 && l.D != last {
		return nil, fmt.Errorf("input %v does not end in D = %d", in[0], l.D)
	}
	l.D = last
	l.W, l.B = nil, nil
	if !l.NoAffine {
		l.W = newParam([]int{l.D}, InitOne, 0)
		l.W.Name = "weight"
		l.B = newParam([]int{l.D}, InitZero, 0)
		l.B.Name = "bias"
	}
	return out, nil
}

func (l *LayerNorm) Params() []*Param {
	if l.NoAffine {
		return nil
	}
	return []*Param{l.W, l.B}
}

// lnPass is a LayerNorm pass in progress. Passes are pooled with their
// chunk functions bound once, so that a pass allocates nothing.
type lnPass struct {
	d                 int
	eps               float64
	x, y, xh, inv     []float32
	w, b, dy, dx      []float32
	dw, db            []float32
	rows              int
	fwd, bwd, colSums func(lo, hi int)
}

var lnPasses = sync.Pool{New: func() any {
	p := new(lnPass)
	p.fwd, p.bwd, p.colSums = p.forwardRows, p.backwardRows, p.paramGrads
	return p
}}

func (p *lnPass) release() {
	*p = lnPass{fwd: p.fwd, bwd: p.bwd, colSums: p.colSums}
	lnPasses.Put(p)
}

// lnGrain is the fewest rows worth a thread: a row costs about 8·D
// operations.
func lnGrain(d int) int { return max(1, mathGrain/d) }

// Forward saves x̂ (buffer 1; the output itself with NoAffine) and each
// row's 1/√(var+eps) (buffer 2) for Backward.
func (l *LayerNorm) Forward(c *Ctx, s *Slot, in []*Tensor) *Tensor {
	x := in[0]
	y := s.Buf(0, x.Shape()...)
	xh := y
	if !l.NoAffine {
		xh = s.Buf(1, x.Shape()...)
	}
	p := lnPasses.Get().(*lnPass)
	p.d, p.eps = l.D, l.Eps
	p.x, p.y, p.xh = F32(x), F32(y), F32(xh)
	p.rows = len(p.x) / l.D
	p.inv = F32(s.Buf(2, p.rows))
	if !l.NoAffine {
		p.w, p.b = F32(l.W.Value), F32(l.B.Value)
	}
	parallel(threadsOf(c), p.rows, lnGrain(l.D), p.fwd)
	p.release()
	return y
}

// forwardRows normalises rows [lo, hi): with the kernels eight at a time,
// else four, so that the rows' sequential sums overlap in the pipeline.
func (p *lnPass) forwardRows(lo, hi int) {
	d := p.d
	r := lo
	if lnKernels() {
		n4 := d &^ 3
		for ; r+8 <= hi; r += 8 {
			var k [8]float64
			var m [16]float64 // S₁ of the eight rows, then S₂
			x := p.x[r*d : (r+8)*d]
			for i := range k {
				k[i] = float64(x[i*d])
			}
			if n4 > 0 {
				lnMoments8(&x[0], d, n4, &k, &m)
			}
			for i := range 8 {
				s1, s2 := m[i], m[8+i]
				for _, v := range x[i*d+n4 : (i+1)*d] { // the row's last columns
					e := float64(v) - k[i]
					s1 += e
					s2 += float64(e * e)
				}
				p.normRow(r+i, x[i*d], s1, s2)
			}
		}
	} else {
		for ; r+4 <= hi; r += 4 {
			var m [8]float64 // S₁ of the four rows, then S₂
			x := p.x[r*d : (r+4)*d]
			m[0], m[1], m[2], m[3], m[4], m[5], m[6], m[7] = rowMoments4(x, d)
			for k := range 4 {
				p.normRow(r+k, x[k*d], m[k], m[4+k])
			}
		}
	}
	for ; r < hi; r++ {
		xs := p.x[r*d : (r+1)*d]
		k := float64(xs[0])
		var s1, s2 float64
		for _, v := range xs {
			e := float64(v) - k
			s1 += e
			s2 += float64(e * e)
		}
		p.normRow(r, xs[0], s1, s2)
	}
}

// rowMoments4 returns, for each of four consecutive rows of width d in x,
// S₁ = Σ(x−x₀) and S₂ = Σ(x−x₀)², x₀ the row's first value, in float64 in
// row order.
func rowMoments4(x []float32, d int) (a0, a1, a2, a3, b0, b1, b2, b3 float64) {
	x0, x1, x2, x3 := x[:d], x[d:2*d], x[2*d:3*d], x[3*d:4*d]
	k0, k1, k2, k3 := float64(x0[0]), float64(x1[0]), float64(x2[0]), float64(x3[0])
	x1, x2, x3 = x1[:len(x0)], x2[:len(x0)], x3[:len(x0)]
	for j, v := range x0 {
		e0, e1, e2, e3 := float64(v)-k0, float64(x1[j])-k1, float64(x2[j])-k2, float64(x3[j])-k3
		a0 += e0
		a1 += e1
		a2 += e2
		a3 += e3
		b0 += float64(e0 * e0)
		b1 += float64(e1 * e1)
		b2 += float64(e2 * e2)
		b3 += float64(e3 * e3)
	}
	return
}

// normRow writes row r of x̂ and y from the row's first value x0 and its
// shifted sums S₁ and S₂ (see rowMoments4).
func (p *lnPass) normRow(r int, x0 float32, s1, s2 float64) {
	d := p.d
	n := float64(d)
	q := s1 / n
	mean := float64(x0) + q
	v := max(0, s2/n-float64(q*q))
	inv := 1 / math.Sqrt(v+p.eps)
	p.inv[r] = float32(inv)
	xs, xh := p.x[r*d:(r+1)*d], p.xh[r*d:(r+1)*d]
	var w, b, ys []float32
	if p.w != nil {
		w, b, ys = p.w[:d], p.b[:d], p.y[r*d:(r+1)*d]
	}
	nv := vector8(d)
	if nv > 0 {
		lnNormAVX2(&xs[0], &xh[0], at(ys, 0), nv, mean, inv, at(w, 0), at(b, 0))
	}
	if w == nil {
		for j := nv; j < d; j++ {
			xh[j] = float32((float64(xs[j]) - mean) * inv)
		}
		return
	}
	for j := nv; j < d; j++ {
		h := float32((float64(xs[j]) - mean) * inv)
		xh[j] = h
		ys[j] = float32(h*w[j]) + b[j]
	}
}

// Backward: with g = dy·w, dx = inv·(g − mean(g) − x̂·mean(g·x̂)), the row
// means in float64 in a fixed order (gradSumsRow); dw += Σ dy·x̂ and
// db += Σ dy over the rows, each column summed in row order by one
// goroutine.
func (l *LayerNorm) Backward(c *Ctx, s *Slot, in []*Tensor, out, dout *Tensor, need []bool) []*Tensor {
	g := s.Grads(1)
	d := l.D
	p := lnPasses.Get().(*lnPass)
	p.d = d
	p.dy = F32(dout)
	p.rows = len(p.dy) / d
	p.inv = F32(s.Buf(2, p.rows))
	if l.NoAffine {
		p.xh = F32(out)
	} else {
		p.xh = F32(s.Buf(1, dout.Shape()...))
		p.w = F32(l.W.Value)
		p.dw, p.db = F32(l.W.Grad), F32(l.B.Grad)
		columnChunks(c, p.rows, d, p.colSums)
	}
	if need[0] {
		dx := s.Buf(3, dout.Shape()...)
		p.dx = F32(dx)
		parallel(threadsOf(c), p.rows, lnGrain(d), p.bwd)
		g[0] = dx
	}
	p.release()
	return g
}

// paramGrads adds columns [lo, hi) of Σ dy·x̂ and Σ dy to dw and db.
func (p *lnPass) paramGrads(lo, hi int) {
	d := p.d
	if nv := vector8(hi - lo); nv > 0 && p.rows > 0 {
		lnColSumsAVX2(&p.dy[lo], &p.xh[lo], p.rows, d, nv, &p.dw[lo], &p.db[lo])
		lo += nv
	}
	if lo == hi {
		return
	}
	dw, db := p.dw[lo:hi], p.db[lo:hi]
	for r := 0; r < p.rows; r++ {
		dys, xh := p.dy[r*d+lo:r*d+hi], p.xh[r*d+lo:r*d+hi]
		dw, db, xh = dw[:len(dys)], db[:len(dys)], xh[:len(dys)]
		for j, v := range dys {
			dw[j] += float32(v * xh[j])
			db[j] += v
		}
	}
}

// backwardRows writes the input gradient of rows [lo, hi).
func (p *lnPass) backwardRows(lo, hi int) {
	d := p.d
	for r := lo; r < hi; r++ {
		sg, sgx := gradSumsRow(p.dy[r*d:(r+1)*d], p.xh[r*d:(r+1)*d], p.w)
		p.gradRow(r, sg, sgx)
	}
}

// gradSumsRow returns a row's Σg and Σg·x̂ in float64, g = dy·w rounded to
// float32 (dy when w is nil). The order is fixed, and made for vectors: the
// first n₈ = len(dy) &^ 7 terms go to eight partial sums, partial k adding
// the terms j ≡ k (mod 8) in ascending j, combined as ((p₀+p₄) + (p₂+p₆)) +
// ((p₁+p₅) + (p₃+p₇)); the last terms follow in order.
func gradSumsRow(dy, xh, w []float32) (sg, sgx float64) {
	n8 := len(dy) &^ 7
	xh = xh[:len(dy)]
	if w != nil {
		w = w[:len(dy)]
	}
	switch {
	case n8 > 0 && lnKernels():
		var s [2]float64
		lnGradSumsRow(&dy[0], &xh[0], at(w, 0), n8, &s)
		sg, sgx = s[0], s[1]
	case n8 > 0:
		var ps, qs [8]float64
		for j := 0; j < n8; j += 8 {
			for k := range 8 {
				g := dy[j+k]
				if w != nil {
					g *= w[j+k]
				}
				ps[k] += float64(g)
				qs[k] += float64(float64(g) * float64(xh[j+k]))
			}
		}
		sg = ((ps[0] + ps[4]) + (ps[2] + ps[6])) + ((ps[1] + ps[5]) + (ps[3] + ps[7]))
		sgx = ((qs[0] + qs[4]) + (qs[2] + qs[6])) + ((qs[1] + qs[5]) + (qs[3] + qs[7]))
	}
	for j := n8; j < len(dy); j++ {
		g := dy[j]
		if w != nil {
			g *= w[j]
		}
		sg += float64(g)
		sgx += float64(float64(g) * float64(xh[j]))
	}
	return sg, sgx
}

// gradRow writes row r of dx from the row's Σg and Σg·x̂.
func (p *lnPass) gradRow(r int, sg, sgx float64) {
	d := p.d
	a, b := sg/float64(d), sgx/float64(d)
	inv := float64(p.inv[r])
	dys, xh, dx := p.dy[r*d:(r+1)*d], p.xh[r*d:(r+1)*d], p.dx[r*d:(r+1)*d]
	xh, dx = xh[:len(dys)], dx[:len(dys)]
	var w []float32
	if p.w != nil {
		w = p.w[:len(dys)]
	}
	nv := vector8(d)
	if nv > 0 {
		lnGradAVX2(&dys[0], &xh[0], &dx[0], nv, at(w, 0), a, b, inv)
	}
	for j := nv; j < d; j++ {
		gv := dys[j]
		if w != nil {
			gv *= w[j]
		}
		dx[j] = float32(inv * (float64(gv) - a - float64(float64(xh[j])*b)))
	}
}
