package nn

import "fmt"

// Pad2D surrounds an NHWC input with zeros: Top and Bottom rows, Left and
// Right columns.
type Pad2D struct {
	Top, Left, Bottom, Right int
	h, w, c                  int
}

func (p *Pad2D) Kind() string     { return "pad2d" }
func (p *Pad2D) Params() []*Param { return nil }
func (p *Pad2D) Build(in [][]int) ([]int, error) {
	if len(in) != 1 || len(in[0]) != 3 {
		return nil, fmt.Errorf("takes one [H, W, C] input, got %v", in)
	}
	if p.Top < 0 || p.Left < 0 || p.Bottom < 0 || p.Right < 0 {
		return nil, fmt.Errorf("negative padding %d %d %d %d", p.Top, p.Left, p.Bottom, p.Right)
	}
	p.h, p.w, p.c = in[0][0], in[0][1], in[0][2]
	return []int{p.h + p.Top + p.Bottom, p.w + p.Left + p.Right, p.c}, nil
}

// rows calls fn for every input row (sample b, row y) with the offsets of
// that row in the input and in the padded output.
func (p *Pad2D) rows(n int, fn func(in, out int)) {
	ho, wo := p.h+p.Top+p.Bottom, p.w+p.Left+p.Right
	for b := 0; b < n; b++ {
		for y := 0; y < p.h; y++ {
			fn((b*p.h+y)*p.w*p.c, ((b*ho+y+p.Top)*wo+p.Left)*p.c)
		}
	}
}

func (p *Pad2D) Forward(c *Ctx, s *Slot, in []*Tensor) *Tensor {
	n := Rows(in[0])
	y := s.ZeroBuf(0, n, p.h+p.Top+p.Bottom, p.w+p.Left+p.Right, p.c)
	x, yd, row := F32(in[0]), F32(y), p.w*p.c
	p.rows(n, func(i, o int) { copy(yd[o:o+row], x[i:i+row]) })
	return y
}

func (p *Pad2D) Backward(c *Ctx, s *Slot, in []*Tensor, out, dout *Tensor, need []bool) []*Tensor {
	g := s.Grads(1)
	if !need[0] {
		return g
	}
	n := Rows(in[0])
	dx := s.Buf(1, in[0].Shape()...)
	d, dy, row := F32(dx), F32(dout), p.w*p.c
	p.rows(n, func(i, o int) { copy(d[i:i+row], dy[o:o+row]) })
	g[0] = dx
	return g
}
