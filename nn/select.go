package nn

import "fmt"

// Expand is ONNX's Expand of a value: each sample's tensor, of Shape's rank
// with each dimension Shape's or 1, repeated along its axes of size 1 to
// Shape. Backward sums the gradient over the repeats, in ascending order.
type Expand struct {
	Shape []int

	plan *bplan
}

func (l *Expand) Kind() string     { return "expand" }
func (l *Expand) Params() []*Param { return nil }

func (l *Expand) Build(in [][]int) ([]int, error) {
	if len(in) != 1 {
		return nil, fmt.Errorf("takes one input, got %d", len(in))
	}
	plan, err := newBplan(l.Shape, in, []bool{true})
	if err != nil {
		return nil, err
	}
	l.plan = plan
	return append([]int(nil), l.Shape...), nil
}

func (l *Expand) Forward(c *Ctx, s *Slot, in []*Tensor) *Tensor {
	n := Rows(in[0])
	y := s.Buf(0, s.withBatch(n, l.Shape)...)
	yd, x := F32(y), F32(in[0])
	sx, _ := l.plan.inner()
	l.plan.each(c, n, cheapGrain, func(o, xo, _, cnt int) {
		ys := yd[o : o+cnt]
		if sx == 0 {
			for j := range ys {
				ys[j] = x[xo]
			}
			return
		}
		copy(ys, x[xo:xo+cnt])
	})
	return y
}

func (l *Expand) Backward(c *Ctx, s *Slot, in []*Tensor, out, dout *Tensor, need []bool) []*Tensor {
	g := s.Grads(1)
	if !need[0] {
		return g
	}
	dx := s.Buf(1, in[0].Shape()...)
	l.plan.reduce(c, Rows(in[0]), 0, F32(dx), F32(dout), sumPlain, nil, 0)
	g[0] = dx
	return g
}

// Select is ONNX's Where of a condition computed from the data and two
// constant scalars: y = A where the condition is not 0, else B. The
// condition carries no gradient.
type Select struct{ A, B float32 }

func (Select) Kind() string                    { return "select" }
func (Select) Params() []*Param                { return nil }
func (Select) Build(in [][]int) ([]int, error) { return oneInput(in) }

func (l Select) Forward(c *Ctx, s *Slot, in []*Tensor) *Tensor {
	a, b := l.A, l.B
	return unaryForward(c, s, in[0], cheapGrain, func(y, x, _ []float32) {
		y = y[:len(x)]
		for i, v := range x {
			if v != 0 {
				y[i] = a
			} else {
				y[i] = b
			}
		}
	})
}

func (Select) Backward(c *Ctx, s *Slot, in []*Tensor, out, dout *Tensor, need []bool) []*Tensor {
	return s.Grads(1)
}

// MaskBy is masked_fill with a mask computed from the data: inputs x and a
// condition whose per-sample shape has x's rank, each dimension x's or 1;
// y = Fill where the condition is not 0 (is 0, with Invert), else x.
// Backward passes dout where x passed, 0 elsewhere; the condition carries
// no gradient.
type MaskBy struct {
	Fill   float32
	Invert bool

	plan *bplan
}

func (l *MaskBy) Kind() string     { return "maskby" }
func (l *MaskBy) Params() []*Param { return nil }

func (l *MaskBy) Build(in [][]int) ([]int, error) {
	if len(in) != 2 {
		return nil, fmt.Errorf("takes two inputs, got %d", len(in))
	}
	plan, err := newBplan(in[0], in, []bool{true, true})
	if err != nil {
		return nil, err
	}
	l.plan = plan
	return append([]int(nil), in[0]...), nil
}

// fill writes src into dst with f where the condition holds (does not,
// with Invert), the condition broadcast to x's shape.
func (l *MaskBy) fill(c *Ctx, n int, dst, src, cond []float32, f float32) {
	_, sc := l.plan.inner()
	inv := l.Invert
	l.plan.each(c, n, cheapGrain, func(o, _, co, cnt int) {
		for j := range cnt {
			if (cond[co+j*sc] != 0) != inv {
				dst[o+j] = f
			} else {
				dst[o+j] = src[o+j]
			}
		}
	})
}

func (l *MaskBy) Forward(c *Ctx, s *Slot, in []*Tensor) *Tensor {
	y := s.Buf(0, in[0].Shape()...)
	l.fill(c, Rows(in[0]), F32(y), F32(in[0]), F32(in[1]), l.Fill)
	return y
}

// Backward is the mask applied to dout with 0 where x was replaced.
func (l *MaskBy) Backward(c *Ctx, s *Slot, in []*Tensor, out, dout *Tensor, need []bool) []*Tensor {
	g := s.Grads(2)
	if !need[0] {
		return g
	}
	dx := s.Buf(1, in[0].Shape()...)
	l.fill(c, Rows(in[0]), F32(dx), F32(dout), F32(in[1]), 0)
	g[0] = dx
	return g
}

// CumSum is ONNX's CumSum along the last per-sample axis: each element the
// sum of those before it in the row (after it, with Reverse), itself
// included unless Exclusive, added in float64 in that order and rounded
// once. Backward is the same sum of the gradient the other way.
type CumSum struct{ Exclusive, Reverse bool }

func (CumSum) Kind() string                    { return "cumsum" }
func (CumSum) Params() []*Param                { return nil }
func (CumSum) Build(in [][]int) ([]int, error) { return rowInput(in) }

// scan writes the cumulative sums of src's rows of w into dst.
func scan(c *Ctx, dst, src []float32, w int, exclusive, reverse bool) {
	eachRow(c, len(src)/w, w, func(r int) {
		var sum float64
		for j := range w {
			if reverse {
				j = w - 1 - j
			}
			v := float64(src[r*w+j])
			if !exclusive {
				sum += v
			}
			dst[r*w+j] = float32(sum)
			if exclusive {
				sum += v
			}
		}
	})
}

func (l CumSum) Forward(c *Ctx, s *Slot, in []*Tensor) *Tensor {
	y := s.Buf(0, in[0].Shape()...)
	scan(c, F32(y), F32(in[0]), lastDim(in[0]), l.Exclusive, l.Reverse)
	return y
}

func (l CumSum) Backward(c *Ctx, s *Slot, in []*Tensor, out, dout *Tensor, need []bool) []*Tensor {
	g := s.Grads(1)
	if !need[0] {
		return g
	}
	dx := s.Buf(1, dout.Shape()...)
	scan(c, F32(dx), F32(dout), lastDim(dout), l.Exclusive, !l.Reverse)
	g[0] = dx
	return g
}
