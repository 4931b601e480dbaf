package nn

import (
	"fmt"
	"math"
	"sync"

	"github.com/ppnode/ppnode/nn/internal/dnnl"
)

// ReLU is y = max(x, 0).
type ReLU struct{}

func (ReLU) Kind() string                    { return "relu" }
func (ReLU) Params() []*Param                { return nil }
func (ReLU) Build(in [][]int) ([]int, error) { return oneInput(in) }

func (ReLU) Forward(c *Ctx, s *Slot, in []*Tensor) *Tensor {
	y := s.Buf(0, in[0].Shape()...)
	elementwise(c, ewReLU, F32(in[0]), nil, F32(y))
	return y
}

func (ReLU) Backward(c *Ctx, s *Slot, in []*Tensor, out, dout *Tensor, need []bool) []*Tensor {
	g := s.Grads(1)
	if !need[0] {
		return g
	}
	dx := s.Buf(1, dout.Shape()...)
	elementwise(c, ewReLUGrad, F32(out), F32(dout), F32(dx))
	g[0] = dx
	return g
}

func oneInput(in [][]int) ([]int, error) {
	if len(in) != 1 {
		return nil, fmt.Errorf("takes one input, got %d", len(in))
	}
	return append([]int(nil), in[0]...), nil
}

// Dropout zeroes each element with probability P in training and scales the
// others by 1/(1-P). Its mask comes from a generator seeded by (seed, step,
// micro-batch, layer), so a replayed micro-batch drops the same elements.
type Dropout struct {
	P    float64
	name uint64 // hash of the node name, set when the layer joins a graph
}

// NewDropout returns a dropout layer.
func NewDropout(p float64) *Dropout { return &Dropout{P: p} }

func (d *Dropout) setName(name string) { d.name = nameHash(name) }

func (d *Dropout) Kind() string     { return "dropout" }
func (d *Dropout) Params() []*Param { return nil }
func (d *Dropout) Build(in [][]int) ([]int, error) {
	if d.P < 0 || d.P >= 1 {
		return nil, fmt.Errorf("dropout probability %v is not in [0, 1)", d.P)
	}
	return oneInput(in)
}

func (d *Dropout) Forward(c *Ctx, s *Slot, in []*Tensor) *Tensor {
	if !c.Train || d.P == 0 {
		return in[0]
	}
	y := s.Buf(0, in[0].Shape()...)
	mask := s.Buf(1, in[0].Shape()...)
	x, yd, m := F32(in[0]), F32(y), F32(mask)
	r := NewRand(c.Seed, uint64(c.Step), uint64(c.Micro), d.name)
	scale := float32(1 / (1 - d.P))
	for i := range x {
		if r.Float64() < d.P {
			m[i] = 0
		} else {
			m[i] = scale
		}
		yd[i] = x[i] * m[i]
	}
	return y
}

func (d *Dropout) Backward(c *Ctx, s *Slot, in []*Tensor, out, dout *Tensor, need []bool) []*Tensor {
	g := s.Grads(1)
	if !need[0] {
		return g
	}
	if !c.Train || d.P == 0 {
		g[0] = dout
		return g
	}
	dx := s.Buf(2, dout.Shape()...)
	m, dy, dd := F32(s.Buf(1, dout.Shape()...)), F32(dout), F32(dx)
	for i := range dd {
		dd[i] = dy[i] * m[i]
	}
	g[0] = dx
	return g
}

// Add sums its inputs, all of the same shape (residual connections).
type Add struct{}

func (Add) Kind() string     { return "add" }
func (Add) Params() []*Param { return nil }
func (Add) Build(in [][]int) ([]int, error) {
	if len(in) < 2 {
		return nil, fmt.Errorf("takes two or more inputs, got %d", len(in))
	}
	for _, s := range in[1:] {
		if !SameShape(s, in[0]) {
			return nil, fmt.Errorf("input shapes %v and %v differ", in[0], s)
		}
	}
	return append([]int(nil), in[0]...), nil
}

func (Add) Forward(c *Ctx, s *Slot, in []*Tensor) *Tensor {
	y := s.Buf(0, in[0].Shape()...)
	yd := F32(y)
	elementwise(c, ewAdd, F32(in[0]), F32(in[1]), yd)
	for _, t := range in[2:] {
		elementwise(c, ewAdd, yd, F32(t), yd)
	}
	return y
}

func (Add) Backward(c *Ctx, s *Slot, in []*Tensor, out, dout *Tensor, need []bool) []*Tensor {
	g := s.Grads(len(in))
	for i := range in {
		if need[i] {
			g[i] = dout
		}
	}
	return g
}

// ewOp is an elementwise operation of ReLU, Add and the gradient sums.
type ewOp int

const (
	ewReLU     ewOp = dnnl.OpReLU     // y = max(a, 0)
	ewReLUGrad ewOp = dnnl.OpReLUGrad // y = b where a > 0, else 0
	ewAdd      ewOp = dnnl.OpAdd      // y = a + b
)

// elementwise runs op over y's values (y may be a): on the team thread on
// its OpenMP team, else in chunks of at least 32K values (smaller ones cost
// more to hand to a thread than to compute) on the worker goroutines. The
// chunks write disjoint values, so the split does not change the bits.
func elementwise(c *Ctx, op ewOp, a, b, y []float32) {
	if c != nil && c.team {
		dnnl.ElementwiseTeam(max(1, min(threadsOf(c), len(y)>>15)), int(op), a, b, y)
		return
	}
	p := ewPasses.Get().(*ewPass)
	p.op, p.a, p.b, p.y = op, a, b, y
	parallel(threadsOf(c), len(y), 1<<15, p.run)
	p.a, p.b, p.y = nil, nil, nil
	ewPasses.Put(p)
}

// ewPass is an elementwise pass in progress. Passes are pooled with their
// chunk function bound once, so that a pass allocates nothing.
type ewPass struct {
	op      ewOp
	a, b, y []float32
	run     func(lo, hi int)
}

var ewPasses = sync.Pool{New: func() any {
	p := new(ewPass)
	p.run = p.chunk
	return p
}}

func (p *ewPass) chunk(lo, hi int) {
	a, y := p.a[lo:hi], p.y[lo:hi]
	switch p.op {
	case ewReLU:
		relu(a, y)
	case ewReLUGrad:
		reluGrad(a, p.b[lo:hi], y)
	case ewAdd:
		addVec(a, p.b[lo:hi], y)
	}
}

// relu writes y = max(x, 0), the AVX2 kernel taking what it can.
func relu(x, y []float32) {
	y = y[:len(x)]
	nv := vector8(len(x))
	if nv > 0 {
		reluAVX2(&x[0], &y[0], nv)
	}
	for i := nv; i < len(x); i++ {
		y[i] = max(x[i], 0)
	}
}

// reluGrad writes dx = dy where y > 0, else 0.
func reluGrad(y, dy, dx []float32) {
	dy, dx = dy[:len(y)], dx[:len(y)]
	nv := vector8(len(y))
	if nv > 0 {
		reluGradAVX2(&y[0], &dy[0], &dx[0], nv)
	}
	for i := nv; i < len(y); i++ {
		dx[i] = reluGradOf(y[i], dy[i])
	}
}

// reluGradOf is dy where the ReLU's output y is > 0, else +0. Branch-free:
// the sign pattern of activations is random, and a mispredicted branch per
// element costs more than the masking. -bits>>31 is all ones exactly when
// y > 0 (y is never NaN here unless the input was).
func reluGradOf(y, dy float32) float32 {
	mask := uint32(-int32(math.Float32bits(y)) >> 31)
	return math.Float32frombits(math.Float32bits(dy) & mask)
}

// addVec writes y = a + b (y may be a).
func addVec(a, b, y []float32) {
	b, y = b[:len(a)], y[:len(a)]
	nv := vector8(len(a))
	if nv > 0 {
		addAVX2(&a[0], &b[0], &y[0], nv)
	}
	for i := nv; i < len(a); i++ {
		y[i] = a[i] + b[i]
	}
}
