package nn

import "fmt"

// Flatten reshapes [N, ...] to [N, prod(...)]. The output shares the input's
// memory.
type Flatten struct{}

func (Flatten) Kind() string     { return "flatten" }
func (Flatten) Params() []*Param { return nil }
func (Flatten) Build(in [][]int) ([]int, error) {
	if len(in) != 1 {
		return nil, fmt.Errorf("takes one input, got %d", len(in))
	}
	return []int{Size(in[0])}, nil
}

func (Flatten) Forward(c *Ctx, s *Slot, in []*Tensor) *Tensor {
	return view(s, 0, in[0], Rows(in[0]), Cols(in[0]))
}

func (Flatten) Backward(c *Ctx, s *Slot, in []*Tensor, out, dout *Tensor, need []bool) []*Tensor {
	g := s.Grads(1)
	if need[0] {
		g[0] = view(s, 1, dout, in[0].Shape()...)
	}
	return g
}

// view returns buffer i of s as a tensor header over t's memory with the
// given shape, reusing the header while t's memory and the shape stay.
func view(s *Slot, i int, t *Tensor, shape ...int) *Tensor {
	for len(s.bufs) <= i {
		s.bufs = append(s.bufs, nil)
	}
	d := F32(t)
	v := s.bufs[i]
	if v != nil && SameShape(v.Shape(), shape) && len(F32(v)) == len(d) && (len(d) == 0 || &F32(v)[0] == &d[0]) {
		return v
	}
	v = FromData(d, shape...)
	s.bufs[i] = v
	return v
}

// Concat joins its inputs along the per-sample axis Axis, counted from the
// end: 0 (the zero value) is the last axis (features, or channels in
// NHWC), 1 the one before it. All other dimensions must agree. It merges
// branches.
type Concat struct {
	Axis int

	widths []int // each input's elements per row: its size along Axis × the elements after Axis
	total  int   // sum of widths
	dim    int   // the output's size along Axis
}

func (c *Concat) Kind() string     { return "concat" }
func (c *Concat) Params() []*Param { return nil }
func (c *Concat) Build(in [][]int) ([]int, error) {
	if len(in) < 1 {
		return nil, fmt.Errorf("takes at least one input")
	}
	r := len(in[0])
	if c.Axis < 0 || c.Axis >= r {
		return nil, fmt.Errorf("axis %d from the end is outside input %v", c.Axis, in[0])
	}
	a := r - 1 - c.Axis
	inner := Size(in[0][a+1:])
	c.widths, c.total, c.dim = c.widths[:0], 0, 0
	for _, s := range in {
		if len(s) != r || !SameShape(s[:a], in[0][:a]) || !SameShape(s[a+1:], in[0][a+1:]) {
			return nil, fmt.Errorf("input shapes %v and %v differ outside axis %d from the end", in[0], s, c.Axis)
		}
		c.widths = append(c.widths, s[a]*inner)
		c.total += s[a] * inner
		c.dim += s[a]
	}
	out := append([]int(nil), in[0]...)
	out[a] = c.dim
	return out, nil
}

func (c *Concat) Forward(ctx *Ctx, s *Slot, in []*Tensor) *Tensor {
	first := in[0].Shape()
	total := c.total
	rows := Size(first) / c.widths[0]
	y := s.Buf(0, s.shapeAt(first, len(first)-1-c.Axis, c.dim)...)
	yd := F32(y)
	off := 0
	for k, t := range in {
		w := c.widths[k]
		x := F32(t)
		for r := 0; r < rows; r++ {
			copy(yd[r*total+off:r*total+off+w], x[r*w:(r+1)*w])
		}
		off += w
	}
	return y
}

func (c *Concat) Backward(ctx *Ctx, s *Slot, in []*Tensor, out, dout *Tensor, need []bool) []*Tensor {
	g := s.Grads(len(in))
	rows := Size(in[0].Shape()) / c.widths[0]
	total := c.total
	dy := F32(dout)
	off := 0
	for k, t := range in {
		w := c.widths[k]
		if need[k] {
			dx := s.Buf(1+k, t.Shape()...)
			d := F32(dx)
			for r := 0; r < rows; r++ {
				copy(d[r*w:(r+1)*w], dy[r*total+off:r*total+off+w])
			}
			g[k] = dx
		}
		off += w
	}
	return g
}

// shape returns a reusable copy of shape with its last dimension set to last.
func (s *Slot) shape(shape []int, last int) []int {
	return s.shapeAt(shape, len(shape)-1, last)
}

// shapeAt returns a reusable copy of shape with dimension a set to v.
func (s *Slot) shapeAt(shape []int, a, v int) []int {
	if cap(s.dims) < len(shape) {
		s.dims = make([]int, len(shape))
	}
	s.dims = append(s.dims[:0], shape...)
	s.dims[a] = v
	return s.dims
}

// Slice takes elements [From, To) of the per-sample axis Axis, counted from
// the end: 0 (the zero value) is the last axis (an input tower's share of
// the features), 1 the one before it. With Step > 1 it takes every Step-th
// element from From (0 and 1 take them all).
type Slice struct {
	From, To int
	Axis     int
	Step     int

	width, inner int // the input's elements per row (size along Axis × inner), and after Axis
}

func (l *Slice) Kind() string     { return "slice" }
func (l *Slice) Params() []*Param { return nil }
func (l *Slice) Build(in [][]int) ([]int, error) {
	if len(in) != 1 {
		return nil, fmt.Errorf("takes one input, got %d", len(in))
	}
	r := len(in[0])
	if l.Axis < 0 || l.Axis >= r {
		return nil, fmt.Errorf("axis %d from the end is outside input %v", l.Axis, in[0])
	}
	if l.Step < 0 {
		return nil, fmt.Errorf("negative step %d", l.Step)
	}
	a := r - 1 - l.Axis
	size := in[0][a]
	if l.From < 0 || l.To > size || l.From >= l.To {
		return nil, fmt.Errorf("slice [%d, %d) is outside the %d elements of axis %d from the end", l.From, l.To, size, l.Axis)
	}
	l.inner = Size(in[0][a+1:])
	l.width = size * l.inner
	out := append([]int(nil), in[0]...)
	out[a] = l.count()
	return out, nil
}

// step is the stride along the axis; count the elements taken.
func (l *Slice) step() int  { return max(1, l.Step) }
func (l *Slice) count() int { return (l.To - l.From + l.step() - 1) / l.step() }

func (l *Slice) Forward(c *Ctx, s *Slot, in []*Tensor) *Tensor {
	sh := in[0].Shape()
	k, inner, step := l.count(), l.inner, l.step()
	w := k * inner
	y := s.Buf(0, s.shapeAt(sh, len(sh)-1-l.Axis, k)...)
	x, yd := F32(in[0]), F32(y)
	rows := len(x) / l.width
	for r := 0; r < rows; r++ {
		xs := x[r*l.width : (r+1)*l.width]
		if step == 1 {
			copy(yd[r*w:(r+1)*w], xs[l.From*inner:l.To*inner])
			continue
		}
		for i := 0; i < k; i++ {
			at := (l.From + i*step) * inner
			copy(yd[r*w+i*inner:r*w+(i+1)*inner], xs[at:at+inner])
		}
	}
	return y
}

func (l *Slice) Backward(c *Ctx, s *Slot, in []*Tensor, out, dout *Tensor, need []bool) []*Tensor {
	g := s.Grads(1)
	if !need[0] {
		return g
	}
	k, inner, step := l.count(), l.inner, l.step()
	w := k * inner
	dx := s.ZeroBuf(1, in[0].Shape()...)
	d, dy := F32(dx), F32(dout)
	rows := len(d) / l.width
	for r := 0; r < rows; r++ {
		ds := d[r*l.width : (r+1)*l.width]
		if step == 1 {
			copy(ds[l.From*inner:l.To*inner], dy[r*w:(r+1)*w])
			continue
		}
		for i := 0; i < k; i++ {
			at := (l.From + i*step) * inner
			copy(ds[at:at+inner], dy[r*w+i*inner:r*w+(i+1)*inner])
		}
	}
	g[0] = dx
	return g
}
