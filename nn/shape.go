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

// Concat joins its inputs along the last dimension (features, or channels in
// NHWC); all other dimensions must agree. It merges branches.
type Concat struct {
	widths []int
	total  int // sum of widths
}

func (c *Concat) Kind() string     { return "concat" }
func (c *Concat) Params() []*Param { return nil }
func (c *Concat) Build(in [][]int) ([]int, error) {
	if len(in) < 1 {
		return nil, fmt.Errorf("takes at least one input")
	}
	lead := in[0][:len(in[0])-1]
	c.widths, c.total = c.widths[:0], 0
	for _, s := range in {
		if len(s) != len(in[0]) || !SameShape(s[:len(s)-1], lead) {
			return nil, fmt.Errorf("input shapes %v and %v differ before the last dimension", in[0], s)
		}
		c.widths = append(c.widths, s[len(s)-1])
		c.total += s[len(s)-1]
	}
	return append(append([]int(nil), lead...), c.total), nil
}

func (c *Concat) Forward(ctx *Ctx, s *Slot, in []*Tensor) *Tensor {
	first := in[0].Shape()
	total := c.total
	rows := Size(first) / c.widths[0]
	outShape := s.shape(first, total)
	y := s.Buf(0, outShape...)
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
	if cap(s.dims) < len(shape) {
		s.dims = make([]int, len(shape))
	}
	s.dims = append(s.dims[:0], shape...)
	s.dims[len(shape)-1] = last
	return s.dims
}

// Slice takes features [From, To) of the last dimension (an input tower's
// share of the features).
type Slice struct{ From, To, width int }

func (l *Slice) Kind() string     { return "slice" }
func (l *Slice) Params() []*Param { return nil }
func (l *Slice) Build(in [][]int) ([]int, error) {
	if len(in) != 1 {
		return nil, fmt.Errorf("takes one input, got %d", len(in))
	}
	last := in[0][len(in[0])-1]
	if l.From < 0 || l.To > last || l.From >= l.To {
		return nil, fmt.Errorf("slice [%d, %d) is outside the %d features", l.From, l.To, last)
	}
	l.width = last
	out := append([]int(nil), in[0]...)
	out[len(out)-1] = l.To - l.From
	return out, nil
}

func (l *Slice) Forward(c *Ctx, s *Slot, in []*Tensor) *Tensor {
	w := l.To - l.From
	y := s.Buf(0, s.shape(in[0].Shape(), w)...)
	x, yd := F32(in[0]), F32(y)
	rows := len(x) / l.width
	for r := 0; r < rows; r++ {
		copy(yd[r*w:(r+1)*w], x[r*l.width+l.From:r*l.width+l.To])
	}
	return y
}

func (l *Slice) Backward(c *Ctx, s *Slot, in []*Tensor, out, dout *Tensor, need []bool) []*Tensor {
	g := s.Grads(1)
	if !need[0] {
		return g
	}
	w := l.To - l.From
	dx := s.ZeroBuf(1, in[0].Shape()...)
	d, dy := F32(dx), F32(dout)
	rows := len(d) / l.width
	for r := 0; r < rows; r++ {
		copy(d[r*l.width+l.From:r*l.width+l.To], dy[r*w:(r+1)*w])
	}
	g[0] = dx
	return g
}
