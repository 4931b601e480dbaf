package nn

import (
	"fmt"
	"math"
)

// # Broadcasting
//
// A bplan maps the output of a broadcasting layer, [N, out...], onto one or
// two operands whose per-sample shapes have out's rank with each dimension
// equal to out's or 1 (numpy's rule), with or without the batch axis.
// Axes of size 1 in out are dropped and runs of neighbouring axes along
// which every operand either follows the output or broadcasts are merged,
// so [N, T, D] + [D] is a loop over N·T rows of D, and equal shapes are one
// run. Forward passes walk the output in runs along the last merged axis
// (each); backward passes sum over the broadcast axes with each element's
// terms added in ascending output order, the same at every thread count
// (reduce).

// maxBcastAxes bounds the rank, batch axis included, of a broadcast.
const maxBcastAxes = 17

type bplan struct {
	// dims are the merged axes' sizes; the batch axis is a factor of
	// dims[0] that run time supplies (dims[0] holds the rest).
	dims []int
	ost  []int    // the output's strides
	st   [2][]int // each operand's strides, 0 along axes it broadcasts on
	full [2]bool  // operand i has the output's shape
}

// newBplan plans the broadcast of operands of per-sample shapes ops (one or
// two; batch[i] tells whether operand i has the batch axis) to out.
func newBplan(out []int, ops [][]int, batch []bool) (*bplan, error) {
	if len(out)+1 > maxBcastAxes {
		return nil, fmt.Errorf("rank %d is above the %d axes broadcasting takes", len(out), maxBcastAxes-1)
	}
	for _, o := range ops {
		if len(o) != len(out) {
			return nil, fmt.Errorf("shape %v does not have the rank of %v", o, out)
		}
		for k, d := range o {
			if d != out[k] && d != 1 {
				return nil, fmt.Errorf("shape %v does not broadcast to %v", o, out)
			}
		}
	}
	type axis struct{ size, class int }
	cls := 0
	for i := range ops {
		if batch[i] {
			cls |= 1 << i
		}
	}
	axes := []axis{{1, cls}}
	for k, d := range out {
		if d == 1 {
			continue
		}
		cls := 0
		for i, o := range ops {
			if o[k] == d {
				cls |= 1 << i
			}
		}
		if last := &axes[len(axes)-1]; last.class == cls {
			last.size *= d
		} else {
			axes = append(axes, axis{d, cls})
		}
	}
	m := len(axes)
	p := &bplan{dims: make([]int, m), ost: make([]int, m)}
	for i := range p.st {
		p.st[i] = make([]int, m)
		p.full[i] = i < len(ops)
	}
	os := 1
	var ss [2]int
	ss[0], ss[1] = 1, 1
	for g := m - 1; g >= 0; g-- {
		p.dims[g] = axes[g].size
		p.ost[g] = os
		os *= axes[g].size
		for i := range ops {
			if axes[g].class&(1<<i) != 0 {
				p.st[i][g] = ss[i]
				ss[i] *= axes[g].size
			} else {
				p.full[i] = false
			}
		}
	}
	return p, nil
}

// sizes sets d to the merged axes' sizes for a batch of n and returns
// their number.
func (p *bplan) sizes(n int, d *[maxBcastAxes]int) int {
	copy(d[:], p.dims)
	d[0] *= n
	return len(p.dims)
}

// inner returns the strides of the operands along the last merged axis (0
// or 1).
func (p *bplan) inner() (int, int) {
	m := len(p.dims)
	return p.st[0][m-1], p.st[1][m-1]
}

// each calls fn on the output of a batch of n in runs along the last merged
// axis, in parallel chunks of at least grain elements (a run may be cut at a
// chunk's end): o is a run's offset in the output, a and b the offsets of
// its first element in the operands, cnt its length. Along a run the
// operands advance by inner().
func (p *bplan) each(c *Ctx, n, grain int, fn func(o, a, b, cnt int)) {
	var d [maxBcastAxes]int
	m := p.sizes(n, &d)
	total := 1
	for g := 0; g < m; g++ {
		total *= d[g]
	}
	if total == 0 {
		return
	}
	inner := d[m-1]
	sa, sb := p.st[0], p.st[1]
	parallel(threadsOf(c), total, grain, func(lo, hi int) {
		var idx [maxBcastAxes]int
		row, col := lo/inner, lo%inner
		ra, rb := 0, 0 // the operands' offsets at the start of the row
		for g := m - 2; g >= 0; g-- {
			idx[g] = row % d[g]
			row /= d[g]
			ra += idx[g] * sa[g]
			rb += idx[g] * sb[g]
		}
		for o := lo; o < hi; {
			cnt := min(inner-col, hi-o)
			fn(o, ra+col*sa[m-1], rb+col*sb[m-1], cnt)
			o += cnt
			col = 0
			for g := m - 2; g >= 0; g-- {
				idx[g]++
				ra += sa[g]
				rb += sb[g]
				if idx[g] < d[g] {
					break
				}
				idx[g] = 0
				ra -= d[g] * sa[g]
				rb -= d[g] * sb[g]
			}
		}
	})
}

// Terms of a reduce: src[o], src[o]·src2[q] or src[o]/src2[q].
const (
	sumPlain = iota
	sumMul
	sumDiv
)

// reduce sets dst, of operand k's shape, to the sums over the axes that k
// broadcasts along of the terms of the output's elements (see sumPlain): o
// is an element's offset in the output, q its offset in operand k2 (or o
// when k2 < 0: src2 has the output's shape). Each sum adds its terms in
// ascending o, in float32: the threads take disjoint sets of sums (by the
// outermost axis that k follows, and by chunks of the last axis when k
// follows it), so the bits do not depend on the thread count.
func (p *bplan) reduce(c *Ctx, n, k int, dst, src []float32, mode int, src2 []float32, k2 int) {
	clear(dst)
	var d [maxBcastAxes]int
	m := p.sizes(n, &d)
	ds, os, qs := p.st[k], p.ost, p.ost
	if k2 >= 0 {
		qs = p.st[k2]
	}
	G := -1 // the outermost axis (but the last) that k follows
	for g := 0; g < m-1; g++ {
		if ds[g] != 0 {
			G = g
			break
		}
	}
	inner, keep := d[m-1], ds[m-1] != 0
	threads := threadsOf(c)
	chunks, groups := 1, 1
	if keep {
		chunks = max(1, min(threads, inner/16))
	}
	if G >= 0 {
		groups = d[G]
	}
	items := groups * chunks
	total := 1
	for g := 0; g < m; g++ {
		total *= d[g]
	}
	if total == 0 {
		return
	}
	grain := max(1, cheapGrain/max(1, total/items))
	qi := qs[m-1]
	parallel(threads, items, grain, func(lo, hi int) {
		var idx [maxBcastAxes]int
		for it := lo; it < hi; it++ {
			gi, cj := it/chunks, it%chunks
			jlo, jhi := cj*inner/chunks, (cj+1)*inner/chunks
			so, do, qo := 0, 0, 0
			if G >= 0 {
				so, do, qo = gi*os[G], gi*ds[G], gi*qs[G]
			}
			clear(idx[:m])
			for {
				if keep {
					reduceCols(mode, dst[do+jlo:do+jhi], src[so+jlo:so+jhi], src2, qo+jlo*qi, qi)
				} else {
					dst[do] = reduceRun(mode, dst[do], src[so:so+inner], src2, qo, qi)
				}
				g := m - 2
				for ; g >= 0; g-- {
					if g == G {
						continue
					}
					idx[g]++
					so += os[g]
					do += ds[g]
					qo += qs[g]
					if idx[g] < d[g] {
						break
					}
					idx[g] = 0
					so -= d[g] * os[g]
					do -= d[g] * ds[g]
					qo -= d[g] * qs[g]
				}
				if g < 0 {
					break
				}
			}
		}
	})
}

// reduceCols adds the terms of a run to the sums dst, one each; src2's
// values start at q and advance by qi (0 or 1).
func reduceCols(mode int, dst, src, src2 []float32, q, qi int) {
	dst = dst[:len(src)]
	switch {
	case mode == sumPlain:
		for j, v := range src {
			dst[j] += v
		}
	case qi == 0:
		k := src2[q]
		if mode == sumMul {
			for j, v := range src {
				dst[j] += float32(v * k)
			}
		} else {
			for j, v := range src {
				dst[j] += v / k
			}
		}
	default:
		s2 := src2[q : q+len(src)]
		if mode == sumMul {
			for j, v := range src {
				dst[j] += float32(v * s2[j])
			}
		} else {
			for j, v := range src {
				dst[j] += v / s2[j]
			}
		}
	}
}

// reduceRun adds the terms of a run, in order, to acc.
func reduceRun(mode int, acc float32, src, src2 []float32, q, qi int) float32 {
	switch {
	case mode == sumPlain:
		for _, v := range src {
			acc += v
		}
	case qi == 0:
		k := src2[q]
		if mode == sumMul {
			for _, v := range src {
				acc += float32(v * k)
			}
		} else {
			for _, v := range src {
				acc += v / k
			}
		}
	default:
		s2 := src2[q : q+len(src)]
		if mode == sumMul {
			for j, v := range src {
				acc += float32(v * s2[j])
			}
		} else {
			for j, v := range src {
				acc += v / s2[j]
			}
		}
	}
	return acc
}

// Elementwise operations of a broadcast: y = a op b.
const (
	bAdd = iota
	bSub
	bMul
	bDiv
	bPow
)

// binRow writes y = a op b for a run, a and b advancing by sa and sb (0 or
// 1). Each operation is one float32 operation, as PyTorch's; pow is
// math.Pow in float64, rounded once.
func binRow(op int, y, a, b []float32, sa, sb int) {
	n := len(y)
	switch {
	case sa != 0 && sb != 0:
		a, b = a[:n], b[:n]
		switch op {
		case bAdd:
			for i, v := range a {
				y[i] = v + b[i]
			}
		case bSub:
			for i, v := range a {
				y[i] = v - b[i]
			}
		case bMul:
			for i, v := range a {
				y[i] = v * b[i]
			}
		case bDiv:
			for i, v := range a {
				y[i] = v / b[i]
			}
		case bPow:
			for i, v := range a {
				y[i] = float32(math.Pow(float64(v), float64(b[i])))
			}
		}
	case sa != 0:
		a = a[:n]
		k := b[0]
		switch op {
		case bAdd:
			for i, v := range a {
				y[i] = v + k
			}
		case bSub:
			for i, v := range a {
				y[i] = v - k
			}
		case bMul:
			for i, v := range a {
				y[i] = v * k
			}
		case bDiv:
			for i, v := range a {
				y[i] = v / k
			}
		case bPow:
			e := float64(k)
			for i, v := range a {
				y[i] = float32(math.Pow(float64(v), e))
			}
		}
	default:
		b = b[:n]
		k := a[0]
		switch op {
		case bAdd:
			for i, v := range b {
				y[i] = k + v
			}
		case bSub:
			for i, v := range b {
				y[i] = k - v
			}
		case bMul:
			for i, v := range b {
				y[i] = k * v
			}
		case bDiv:
			for i, v := range b {
				y[i] = k / v
			}
		case bPow:
			u := float64(k)
			for i, v := range b {
				y[i] = float32(math.Pow(u, float64(v)))
			}
		}
	}
}

// binOps names the operations of Broadcast.
var binOps = map[string]int{"add": bAdd, "sub": bSub, "mul": bMul, "div": bDiv}

// Broadcast is y = a Op b of two inputs whose per-sample shapes have equal
// rank and, in each dimension, equal sizes or a 1 (numpy's broadcasting);
// the output takes the larger size of each. Op is "add", "sub", "mul" or
// "div", each one float32 operation as in PyTorch. Backward sums the
// gradient over the axes an input was broadcast along.
type Broadcast struct {
	Op string

	op   int
	out  []int
	plan *bplan
}

func (l *Broadcast) Kind() string     { return "broadcast" }
func (l *Broadcast) Params() []*Param { return nil }

func (l *Broadcast) Build(in [][]int) ([]int, error) {
	op, ok := binOps[l.Op]
	if !ok {
		return nil, fmt.Errorf("unknown operation %q (want add, sub, mul or div)", l.Op)
	}
	if len(in) != 2 {
		return nil, fmt.Errorf("takes two inputs, got %d", len(in))
	}
	a, b := in[0], in[1]
	if len(a) != len(b) {
		return nil, fmt.Errorf("input shapes %v and %v differ in rank", a, b)
	}
	out := make([]int, len(a))
	for k := range a {
		if a[k] != b[k] && a[k] != 1 && b[k] != 1 {
			return nil, fmt.Errorf("input shapes %v and %v do not broadcast", a, b)
		}
		out[k] = max(a[k], b[k])
	}
	plan, err := newBplan(out, in, []bool{true, true})
	if err != nil {
		return nil, err
	}
	l.op, l.out, l.plan = op, out, plan
	return append([]int(nil), out...), nil
}

func (l *Broadcast) Forward(c *Ctx, s *Slot, in []*Tensor) *Tensor {
	n := Rows(in[0])
	y := s.Buf(0, s.withBatch(n, l.out)...)
	yd, a, b := F32(y), F32(in[0]), F32(in[1])
	op := l.op
	if l.plan.full[0] && l.plan.full[1] {
		zipChunks(c, cheapGrain, yd, a, b, func(y, a, b []float32) { binRow(op, y, a, b, 1, 1) })
		return y
	}
	sa, sb := l.plan.inner()
	l.plan.each(c, n, cheapGrain, func(o, ao, bo, cnt int) {
		binRow(op, yd[o:o+cnt], a[ao:], b[bo:], sa, sb)
	})
	return y
}

// Backward: for add dout and dout, for sub dout and −dout, for mul dout·b
// and dout·a, for div dout/b and −dout·a/b² (in float64, as Binary's), each
// summed over the axes its input was broadcast along.
func (l *Broadcast) Backward(c *Ctx, s *Slot, in []*Tensor, out, dout *Tensor, need []bool) []*Tensor {
	g := s.Grads(2)
	n := Rows(in[0])
	p := l.plan
	dy := F32(dout)
	ops := [2][]float32{F32(in[0]), F32(in[1])}
	sa, sb := p.inner()
	for i := 0; i < 2; i++ {
		if !need[i] {
			continue
		}
		other := ops[1-i]
		switch {
		case (l.op == bAdd || l.op == bSub && i == 0) && p.full[i]:
			g[i] = dout
			continue
		case l.op == bAdd || l.op == bSub:
			dx := s.Buf(1+i, in[i].Shape()...)
			d := F32(dx)
			if p.full[i] {
				zipChunks(c, cheapGrain, d, dy, nil, negTo)
			} else {
				p.reduce(c, n, i, d, dy, sumPlain, nil, 0)
				if l.op == bSub && i == 1 {
					negTo(d, d, nil)
				}
			}
			g[i] = dx
			continue
		}
		dx := s.Buf(1+i, in[i].Shape()...)
		d := F32(dx)
		g[i] = dx
		switch {
		case l.op == bMul && p.full[i]:
			// The other input's run starts at its own offset.
			p.each(c, n, cheapGrain, func(o, ao, bo, cnt int) {
				if i == 0 {
					binRow(bMul, d[o:o+cnt], dy[o:], other[bo:], 1, sb)
				} else {
					binRow(bMul, d[o:o+cnt], dy[o:], other[ao:], 1, sa)
				}
			})
		case l.op == bMul:
			p.reduce(c, n, i, d, dy, sumMul, other, 1-i)
		case i == 0 && p.full[0]:
			p.each(c, n, cheapGrain, func(o, ao, bo, cnt int) {
				binRow(bDiv, d[o:o+cnt], dy[o:], other[bo:], 1, sb)
			})
		case i == 0:
			p.reduce(c, n, 0, d, dy, sumDiv, other, 1)
		default:
			// −dout·a/b², into d when b has the output's shape, else into a
			// scratch tensor of the output's shape that is then summed.
			t := d
			if !p.full[1] {
				t = F32(s.Buf(3, dout.Shape()...))
			}
			a, b := ops[0], ops[1]
			p.each(c, n, cheapGrain, func(o, ao, bo, cnt int) {
				ts, dys := t[o:o+cnt], dy[o:o+cnt]
				for j, v := range dys {
					q := float64(b[bo+j*sb])
					ts[j] = float32(-float64(v) * float64(a[ao+j*sa]) / (q * q))
				}
			})
			if !p.full[1] {
				p.reduce(c, n, 1, d, t, sumPlain, nil, 0)
			}
		}
	}
	return g
}

// checkOperand checks the second operand of BroadcastOp or ParamBroadcast,
// of the given shape: len(Const) values, or P's values through Map (P's
// flat values in order when Map is nil).
func checkOperand(shape []int, konst []float32, p *Param, m []int32) error {
	for _, d := range shape {
		if d < 1 {
			return fmt.Errorf("operand shape %v has a dimension below 1", shape)
		}
	}
	n := Size(shape)
	if p == nil {
		if m != nil {
			return fmt.Errorf("map without a parameter")
		}
		if len(konst) != n {
			return fmt.Errorf("constant has %d values for shape %v", len(konst), shape)
		}
		return nil
	}
	if konst != nil {
		return fmt.Errorf("both a constant and a parameter")
	}
	size := len(F32(p.Value))
	if p.Grad != nil && len(F32(p.Grad)) != size {
		return fmt.Errorf("parameter %q has %d values and %d gradients", p.Name, size, len(F32(p.Grad)))
	}
	if m == nil {
		if size != n {
			return fmt.Errorf("parameter %q has %d values for shape %v (and no map)", p.Name, size, shape)
		}
		return nil
	}
	if len(m) != n {
		return fmt.Errorf("map has %d entries for shape %v", len(m), shape)
	}
	for e, k := range m {
		if k < 0 || int(k) >= size {
			return fmt.Errorf("map entry %d is %d, outside parameter %q's %d values", e, k, p.Name, size)
		}
	}
	return nil
}

// operandValues returns the operand's values: konst, P's values, or P's
// values through m gathered into buffer i of s.
func operandValues(s *Slot, i int, konst []float32, p *Param, m []int32) []float32 {
	if p == nil {
		return konst
	}
	pv := F32(p.Value)
	if m == nil {
		return pv
	}
	buf := F32(s.Buf(i, len(m)))
	for e, k := range m {
		buf[e] = pv[k]
	}
	return buf
}

// scatterGrad adds the operand's gradient dc to P's: dP[m[e]] += dc[e] in
// ascending e.
func scatterGrad(p *Param, m []int32, dc []float32) {
	pg := F32(p.Grad)
	if m == nil {
		pg = pg[:len(dc)]
		for e, v := range dc {
			pg[e] += v
		}
		return
	}
	for e, v := range dc {
		pg[m[e]] += v
	}
}

// broadcastOps names the operations of BroadcastOp.
var broadcastOps = map[string]bool{"add": true, "sub": true, "rsub": true, "mul": true, "div": true, "rdiv": true, "pow": true, "prelu": true}

// BroadcastOp is an elementwise operation of its input x and an operand c
// of per-sample shape Shape (x's rank, each dimension x's or 1), the same
// for every sample: "add" x+c, "sub" x−c, "rsub" c−x, "mul" x·c, "div"
// x/c, "rdiv" c/x, "pow" x^c (math.Pow in float64, rounded once) or
// "prelu" x where x > 0, else c·x (PyTorch's prelu, c the slope). c is
// Const (Size(Shape) values) or, when P is set, the trainable parameter P:
// element e of c is P's flat value Map[e] (Map nil: P's values in order).
// The caller makes and names P; Build only checks it. Backward adds to P's
// gradient, at Map[e], the sum of c's gradient at e over the batch and the
// broadcast axes (in ascending output order), e ascending. pow takes a
// constant exponent.
type BroadcastOp struct {
	Op    string
	Shape []int
	Const []float32
	P     *Param
	Map   []int32

	plan *bplan
}

func (l *BroadcastOp) Kind() string { return "broadcastop" }

func (l *BroadcastOp) Params() []*Param {
	if l.P == nil {
		return nil
	}
	return []*Param{l.P}
}

func (l *BroadcastOp) Build(in [][]int) ([]int, error) {
	if !broadcastOps[l.Op] {
		return nil, fmt.Errorf("unknown operation %q (want add, sub, rsub, mul, div, rdiv or pow)", l.Op)
	}
	if len(in) != 1 {
		return nil, fmt.Errorf("takes one input, got %d", len(in))
	}
	if err := checkOperand(l.Shape, l.Const, l.P, l.Map); err != nil {
		return nil, err
	}
	if l.Op == "pow" && l.P != nil {
		return nil, fmt.Errorf("pow takes a constant exponent, not a parameter")
	}
	plan, err := newBplan(in[0], [][]int{l.Shape}, []bool{false})
	if err != nil {
		return nil, err
	}
	l.plan = plan
	return append([]int(nil), in[0]...), nil
}

func (l *BroadcastOp) Forward(c *Ctx, s *Slot, in []*Tensor) *Tensor {
	x := in[0]
	y := s.Buf(0, x.Shape()...)
	xd, yd := F32(x), F32(y)
	cv := operandValues(s, 1, l.Const, l.P, l.Map)
	sc, _ := l.plan.inner()
	var op int
	swap := false
	switch l.Op {
	case "add":
		op = bAdd
	case "sub":
		op = bSub
	case "rsub":
		op, swap = bSub, true
	case "mul":
		op = bMul
	case "div":
		op = bDiv
	case "rdiv":
		op, swap = bDiv, true
	case "pow":
		op = bPow
	case "prelu":
		l.plan.each(c, Rows(x), cheapGrain, func(o, co, _, cnt int) {
			ys, xs := yd[o:o+cnt], xd[o:o+cnt]
			for j, v := range xs {
				if v <= 0 {
					v *= cv[co+j*sc]
				}
				ys[j] = v
			}
		})
		return y
	}
	l.plan.each(c, Rows(x), cheapGrain, func(o, co, _, cnt int) {
		if swap {
			binRow(op, yd[o:o+cnt], cv[co:], xd[o:], sc, 1)
		} else {
			binRow(op, yd[o:o+cnt], xd[o:], cv[co:], 1, sc)
		}
	})
	return y
}

// Backward: dx is dout (add, sub), −dout (rsub), dout·c (mul), dout/c
// (div), −dout·c/x² (rdiv), dout·c·x^(c−1) (pow, 0 where c = 0) or dout,
// dout·c where x ≤ 0 (prelu); c's gradient is the sum of dout, −dout,
// dout, dout·x, −dout·x/c², dout/x or dout·x where x ≤ 0.
func (l *BroadcastOp) Backward(c *Ctx, s *Slot, in []*Tensor, out, dout *Tensor, need []bool) []*Tensor {
	g := s.Grads(1)
	x := in[0]
	n := Rows(x)
	p := l.plan
	xd, dy := F32(x), F32(dout)
	cv := operandValues(s, 1, l.Const, l.P, l.Map)
	sc, _ := p.inner()
	if need[0] {
		switch l.Op {
		case "add", "sub":
			g[0] = dout
		default:
			dx := s.Buf(2, x.Shape()...)
			d := F32(dx)
			g[0] = dx
			switch l.Op {
			case "rsub":
				zipChunks(c, cheapGrain, d, dy, nil, negTo)
			case "mul", "div":
				op := bMul
				if l.Op == "div" {
					op = bDiv
				}
				p.each(c, n, cheapGrain, func(o, co, _, cnt int) {
					binRow(op, d[o:o+cnt], dy[o:], cv[co:], 1, sc)
				})
			case "rdiv":
				p.each(c, n, cheapGrain, func(o, co, _, cnt int) {
					ds, dys, xs := d[o:o+cnt], dy[o:o+cnt], xd[o:o+cnt]
					for j, v := range dys {
						u := float64(xs[j])
						ds[j] = float32(-float64(v) * float64(cv[co+j*sc]) / (u * u))
					}
				})
			case "pow":
				p.each(c, n, cheapGrain, func(o, co, _, cnt int) {
					ds, dys, xs := d[o:o+cnt], dy[o:o+cnt], xd[o:o+cnt]
					for j, v := range dys {
						e := float64(cv[co+j*sc])
						if e == 0 {
							ds[j] = 0
							continue
						}
						ds[j] = float32(float64(v) * e * math.Pow(float64(xs[j]), e-1))
					}
				})
			case "prelu":
				p.each(c, n, cheapGrain, func(o, co, _, cnt int) {
					ds, dys, xs := d[o:o+cnt], dy[o:o+cnt], xd[o:o+cnt]
					for j, v := range dys {
						if xs[j] <= 0 {
							v *= cv[co+j*sc]
						}
						ds[j] = v
					}
				})
			}
		}
	}
	if l.P == nil || !l.P.Trainable() {
		return g
	}
	dc := F32(s.Buf(3, len(cv)))
	switch l.Op {
	case "add", "rsub":
		p.reduce(c, n, 0, dc, dy, sumPlain, nil, 0)
	case "sub":
		p.reduce(c, n, 0, dc, dy, sumPlain, nil, 0)
		negTo(dc, dc, nil)
	case "mul":
		p.reduce(c, n, 0, dc, dy, sumMul, xd, -1)
	case "rdiv":
		p.reduce(c, n, 0, dc, dy, sumDiv, xd, -1)
	case "div":
		t := F32(s.Buf(4, x.Shape()...))
		p.each(c, n, cheapGrain, func(o, co, _, cnt int) {
			ts, dys, xs := t[o:o+cnt], dy[o:o+cnt], xd[o:o+cnt]
			for j, v := range dys {
				q := float64(cv[co+j*sc])
				ts[j] = float32(-float64(v) * float64(xs[j]) / (q * q))
			}
		})
		p.reduce(c, n, 0, dc, t, sumPlain, nil, 0)
	case "prelu":
		t := F32(s.Buf(4, x.Shape()...))
		zipChunks(c, cheapGrain, t, dy, xd, func(ts, dys, xs []float32) {
			for j, v := range dys[:len(ts)] {
				ts[j] = 0
				if xs[j] <= 0 {
					ts[j] = v * xs[j]
				}
			}
		})
		p.reduce(c, n, 0, dc, t, sumPlain, nil, 0)
	}
	scatterGrad(l.P, l.Map, dc)
	return g
}

// Mask is y = Fill where Mask is true, else x (PyTorch's masked_fill, as a
// causal mask's −∞): Mask has per-sample shape Shape, of x's rank with each
// dimension x's or 1, and is the same for every sample. Backward passes
// dout where the mask is false, 0 where it is true.
type Mask struct {
	Shape []int
	Mask  []bool
	Fill  float32

	plan *bplan
	bits []uint32 // all ones where Mask is true
}

func (l *Mask) Kind() string     { return "mask" }
func (l *Mask) Params() []*Param { return nil }

func (l *Mask) Build(in [][]int) ([]int, error) {
	if len(in) != 1 {
		return nil, fmt.Errorf("takes one input, got %d", len(in))
	}
	if len(l.Mask) != Size(l.Shape) {
		return nil, fmt.Errorf("mask has %d values for shape %v", len(l.Mask), l.Shape)
	}
	plan, err := newBplan(in[0], [][]int{l.Shape}, []bool{false})
	if err != nil {
		return nil, err
	}
	l.plan = plan
	l.bits = make([]uint32, len(l.Mask))
	for i, m := range l.Mask {
		if m {
			l.bits[i] = ^uint32(0)
		}
	}
	return append([]int(nil), in[0]...), nil
}

func (l *Mask) Forward(c *Ctx, s *Slot, in []*Tensor) *Tensor {
	x := in[0]
	y := s.Buf(0, x.Shape()...)
	l.apply(c, Rows(x), F32(y), F32(x), math.Float32bits(l.Fill))
	return y
}

// apply writes dst = src (a batch of n) where the mask is false, else the
// float32 of bits fill, without branches.
func (l *Mask) apply(c *Ctx, n int, dst, src []float32, fill uint32) {
	bits := l.bits
	sm, _ := l.plan.inner()
	l.plan.each(c, n, cheapGrain, func(o, mo, _, cnt int) {
		ds, xs := dst[o:o+cnt], src[o:o+cnt]
		if sm == 0 {
			if bits[mo] != 0 {
				for j := range ds {
					ds[j] = math.Float32frombits(fill)
				}
			} else {
				copy(ds, xs)
			}
			return
		}
		ms := bits[mo : mo+cnt]
		for j, v := range xs {
			m := ms[j]
			ds[j] = math.Float32frombits(math.Float32bits(v)&^m | fill&m)
		}
	})
}

func (l *Mask) Backward(c *Ctx, s *Slot, in []*Tensor, out, dout *Tensor, need []bool) []*Tensor {
	g := s.Grads(1)
	if need[0] {
		dx := s.Buf(1, dout.Shape()...)
		l.apply(c, Rows(dout), F32(dx), F32(dout), 0)
		g[0] = dx
	}
	return g
}

// ParamBroadcast outputs [N, Shape...] with every sample the operand (P
// through Map, or Const, as BroadcastOp's), reading its input only for the
// batch size N: a ViT's class token repeated over the batch. Backward adds
// Σₙ dout[n, e] (n ascending) to P's gradient at Map[e], e ascending; the
// input gets no gradient.
type ParamBroadcast struct {
	Shape []int
	P     *Param
	Map   []int32
	Const []float32
}

func (l *ParamBroadcast) Kind() string { return "parambroadcast" }

func (l *ParamBroadcast) Params() []*Param {
	if l.P == nil {
		return nil
	}
	return []*Param{l.P}
}

func (l *ParamBroadcast) Build(in [][]int) ([]int, error) {
	if len(in) != 1 {
		return nil, fmt.Errorf("takes one input, got %d", len(in))
	}
	if err := checkOperand(l.Shape, l.Const, l.P, l.Map); err != nil {
		return nil, err
	}
	return append([]int(nil), l.Shape...), nil
}

func (l *ParamBroadcast) Forward(c *Ctx, s *Slot, in []*Tensor) *Tensor {
	n := Rows(in[0])
	y := s.Buf(0, s.withBatch(n, l.Shape)...)
	yd := F32(y)
	cv := operandValues(s, 1, l.Const, l.P, l.Map)
	per := len(cv)
	parallel(threadsOf(c), n, max(1, cheapGrain/per), func(lo, hi int) {
		for i := lo; i < hi; i++ {
			copy(yd[i*per:(i+1)*per], cv)
		}
	})
	return y
}

func (l *ParamBroadcast) Backward(c *Ctx, s *Slot, in []*Tensor, out, dout *Tensor, need []bool) []*Tensor {
	g := s.Grads(1)
	if l.P == nil || !l.P.Trainable() {
		return g
	}
	dy := F32(dout)
	per := Size(l.Shape)
	rows := len(dy) / per
	dc := F32(s.ZeroBuf(2, per))
	columnChunks(c, rows, per, func(lo, hi int) {
		d := dc[lo:hi]
		for r := 0; r < rows; r++ {
			for j, v := range dy[r*per+lo : r*per+hi] {
				d[j] += v
			}
		}
	})
	scatterGrad(l.P, l.Map, dc)
	return g
}
