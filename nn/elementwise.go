package nn

import (
	"fmt"
	"math"
)

// ReLU is y = max(x, 0).
type ReLU struct{}

func (ReLU) Kind() string                    { return "relu" }
func (ReLU) Params() []*Param                { return nil }
func (ReLU) Build(in [][]int) ([]int, error) { return oneInput(in) }

func (ReLU) Forward(c *Ctx, s *Slot, in []*Tensor) *Tensor {
	y := s.Buf(0, in[0].Shape()...)
	x, yd := F32(in[0]), F32(y)
	if fastPath(c) {
		elementwise(c, ewReLU, x, nil, yd)
		return y
	}
	parallel(threadsOf(c), len(x), 1<<15, func(lo, hi int) {
		xs, ys := x[lo:hi], yd[lo:hi]
		nv := vector8(len(xs))
		if nv > 0 {
			reluAVX2(&xs[0], &ys[0], nv)
		}
		for i := nv; i < len(xs); i++ {
			ys[i] = max(xs[i], 0)
		}
	})
	return y
}

func (ReLU) Backward(c *Ctx, s *Slot, in []*Tensor, out, dout *Tensor, need []bool) []*Tensor {
	g := s.Grads(1)
	if !need[0] {
		return g
	}
	dx := s.Buf(1, dout.Shape()...)
	y, dy, d := F32(out), F32(dout), F32(dx)
	g[0] = dx
	if fastPath(c) {
		elementwise(c, ewReLUGrad, y, dy, d)
		return g
	}
	parallel(threadsOf(c), len(y), 1<<15, func(lo, hi int) {
		ys, dys, ds := y[lo:hi], dy[lo:hi], d[lo:hi]
		ds = ds[:len(ys)]
		dys = dys[:len(ys)]
		nv := vector8(len(ys))
		if nv > 0 {
			reluGradAVX2(&ys[0], &dys[0], &ds[0], nv)
		}
		for i := nv; i < len(ys); i++ {
			v := ys[i]
			// Branch-free: the sign pattern of activations is random, and a
			// mispredicted branch per element costs more than the masking.
			// -bits>>31 is all ones exactly when v > 0 (v is never NaN here
			// unless the input was).
			mask := uint32(-int32(math.Float32bits(v)) >> 31)
			ds[i] = math.Float32frombits(math.Float32bits(dys[i]) & mask)
		}
	})
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
	if fastPath(c) {
		elementwise(c, ewAdd, F32(in[0]), F32(in[1]), yd)
		for _, t := range in[2:] {
			elementwise(c, ewAdd, yd, F32(t), yd)
		}
		return y
	}
	add(c, F32(in[0]), F32(in[1]), yd)
	for _, t := range in[2:] {
		add(c, yd, F32(t), yd)
	}
	return y
}

// accumulate adds src into the first len(src) values of dst.
func accumulate(dst, src []float32) {
	dst = dst[:len(src)]
	nv := vector8(len(src))
	if nv > 0 {
		addAVX2(&dst[0], &src[0], &dst[0], nv)
	}
	for i := nv; i < len(src); i++ {
		dst[i] += src[i]
	}
}

// add writes y = a + b (y may be a) in chunks on c's threads.
func add(c *Ctx, a, b, y []float32) {
	y, b = y[:len(a)], b[:len(a)]
	parallel(threadsOf(c), len(a), 1<<15, func(lo, hi int) {
		as, bs, ys := a[lo:hi], b[lo:hi], y[lo:hi]
		nv := vector8(len(as))
		if nv > 0 {
			addAVX2(&as[0], &bs[0], &ys[0], nv)
		}
		for i := nv; i < len(as); i++ {
			ys[i] = as[i] + bs[i]
		}
	})
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
