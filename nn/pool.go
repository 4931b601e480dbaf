package nn

import (
	"fmt"
	"math"

	"github.com/ppnode/ppnode/nn/internal/dnnl"
)

// window is the resolved geometry of a pooling layer on its input.
type window struct {
	kh, kw, sh, sw int
	pt, pl, pb, pr int
	h, w, c        int
	ho, wo         int
}

// poolWindow resolves the geometry fields shared by MaxPool2D and AvgPool2D
// (see MaxPool2D for their defaults) on an input of shape in. Every window
// must hold an input element: each pad is less than the kernel on its axis.
func poolWindow(in [][]int, k, stride, pad, kh, kw, sh, sw, pt, pl, pb, pr int) (window, error) {
	if len(in) != 1 || len(in[0]) != 3 {
		return window{}, fmt.Errorf("takes one [H, W, C] input, got %v", in)
	}
	if kh == 0 {
		kh = k
	}
	if kw == 0 {
		kw = k
	}
	if sh == 0 {
		sh = stride
		if sh == 0 {
			sh = kh
		}
	}
	if sw == 0 {
		sw = stride
		if sw == 0 {
			sw = kw
		}
	}
	if pt == 0 && pl == 0 && pb == 0 && pr == 0 {
		pt, pl, pb, pr = pad, pad, pad, pad
	}
	g := window{kh: kh, kw: kw, sh: sh, sw: sw, pt: pt, pl: pl, pb: pb, pr: pr, h: in[0][0], w: in[0][1], c: in[0][2]}
	if k < 0 || kh < 1 || kw < 1 || stride < 0 || sh < 1 || sw < 1 || pad < 0 || pt < 0 || pl < 0 || pb < 0 || pr < 0 ||
		pt >= kh || pb >= kh || pl >= kw || pr >= kw {
		return window{}, fmt.Errorf("bad window %dx%d stride %dx%d pads (%d,%d,%d,%d)", kh, kw, sh, sw, pt, pl, pb, pr)
	}
	if g.h+pt+pb < kh || g.w+pl+pr < kw {
		return window{}, fmt.Errorf("input %v is smaller than the window %dx%d", in[0], kh, kw)
	}
	g.ho = (g.h+pt+pb-kh)/sh + 1
	g.wo = (g.w+pl+pr-kw)/sw + 1
	return g, nil
}

// MaxPool2D takes the maximum over KH×KW windows of an NHWC input, moving by
// SH rows and SW columns, with PadT, PadL, PadB and PadR rows and columns of
// -Inf before and after each axis (PyTorch's MaxPool2d without dilation or
// ceil_mode).
//
// The zero value of each geometry field means its default: KH and KW are K;
// SH and SW are Stride, or the window (KH, KW) when Stride is 0; the pads are
// each Pad when all four are zero. Build fills the defaults in.
type MaxPool2D struct {
	K, Stride, Pad         int
	KH, KW                 int // window height and width; 0 means K
	SH, SW                 int // strides; 0 means Stride (or the window)
	PadT, PadL, PadB, PadR int // -Inf before and after each axis; all 0 means Pad

	g    window
	dnnl dnnlPool // oneDNN's primitives (see fastPath)
}

func (p *MaxPool2D) Kind() string     { return "maxpool2d" }
func (p *MaxPool2D) Params() []*Param { return nil }
func (p *MaxPool2D) Build(in [][]int) ([]int, error) {
	if p.Stride == 0 {
		p.Stride = p.K
	}
	g, err := poolWindow(in, p.K, p.Stride, p.Pad, p.KH, p.KW, p.SH, p.SW, p.PadT, p.PadL, p.PadB, p.PadR)
	if err != nil {
		return nil, err
	}
	p.g = g
	p.dnnl.reset()
	p.KH, p.KW, p.SH, p.SW = g.kh, g.kw, g.sh, g.sw
	p.PadT, p.PadL, p.PadB, p.PadR = g.pt, g.pl, g.pb, g.pr
	return []int{g.ho, g.wo, g.c}, nil
}

func (p *MaxPool2D) Forward(c *Ctx, s *Slot, in []*Tensor) *Tensor {
	g := &p.g
	n := Rows(in[0])
	y := s.Buf(0, n, g.ho, g.wo, g.c)
	x, yd := F32(in[0]), F32(y)
	if fastPath(c) && p.dnnl.forward(c, s, g, dnnl.PoolMax, x, yd, n) {
		return y
	}
	p.forward(c, x, yd, s.Ints(0, n*g.ho*g.wo*g.c), n)
	return y
}

// forward is the layer's own forward pass: y and the argmax of each output.
func (p *MaxPool2D) forward(c *Ctx, x, yd []float32, arg []int32, n int) {
	g := &p.g
	parallel(threadsOf(c), n, 1, func(lo, hi int) {
		for b := lo; b < hi; b++ {
			for oy := 0; oy < g.ho; oy++ {
				for ox := 0; ox < g.wo; ox++ {
					o := ((b*g.ho+oy)*g.wo + ox) * g.c
					ys, as := yd[o:o+g.c], arg[o:o+g.c]
					for i := range ys {
						ys[i] = float32(math.Inf(-1))
						as[i] = -1
					}
					for ky := 0; ky < g.kh; ky++ {
						iy := oy*g.sh - g.pt + ky
						if iy < 0 || iy >= g.h {
							continue
						}
						for kx := 0; kx < g.kw; kx++ {
							ix := ox*g.sw - g.pl + kx
							if ix < 0 || ix >= g.w {
								continue
							}
							off := ((b*g.h+iy)*g.w + ix) * g.c
							xs := x[off : off+g.c]
							for i, v := range xs {
								if v > ys[i] || as[i] < 0 {
									ys[i] = v
									as[i] = int32(off + i)
								}
							}
						}
					}
				}
			}
		}
	})
}

func (p *MaxPool2D) Backward(c *Ctx, s *Slot, in []*Tensor, out, dout *Tensor, need []bool) []*Tensor {
	g := s.Grads(1)
	if !need[0] {
		return g
	}
	n := Rows(in[0])
	if fastPath(c) {
		dx := s.Buf(1, in[0].Shape()...)
		if p.dnnl.backward(c, s, &p.g, dnnl.PoolMax, F32(dout), F32(dx), n) {
			g[0] = dx
			return g
		}
		// The forward pass may have left oneDNN's workspace where the
		// argmax belongs: find it again (y gets the same values).
		p.forward(c, F32(in[0]), F32(out), s.Ints(0, len(F32(dout))), n)
	}
	dx := s.ZeroBuf(1, in[0].Shape()...)
	d, dy := F32(dx), F32(dout)
	arg := s.Ints(0, len(dy))
	per := p.g.ho * p.g.wo * p.g.c
	// Windows of one sample touch only that sample's input: split by sample.
	parallel(threadsOf(c), n, 1, func(lo, hi int) {
		for i := lo * per; i < hi*per; i++ {
			d[arg[i]] += dy[i]
		}
	})
	g[0] = dx
	return g
}

// AvgPool2D averages KH×KW windows of an NHWC input, with the geometry of
// MaxPool2D (same fields, same defaults) and zeros as padding: PyTorch's
// AvgPool2d without ceil_mode or divisor_override. With CountIncludePad a
// window's sum is divided by KH·KW, padding included; without, by the
// number of its elements inside the input.
type AvgPool2D struct {
	K, Stride, Pad         int
	KH, KW                 int // window height and width; 0 means K
	SH, SW                 int // strides; 0 means Stride (or the window)
	PadT, PadL, PadB, PadR int // zeros before and after each axis; all 0 means Pad
	CountIncludePad        bool

	g    window
	dnnl dnnlPool // oneDNN's primitives (see fastPath)
}

func (p *AvgPool2D) Kind() string     { return "avgpool2d" }
func (p *AvgPool2D) Params() []*Param { return nil }
func (p *AvgPool2D) Build(in [][]int) ([]int, error) {
	if p.Stride == 0 {
		p.Stride = p.K
	}
	g, err := poolWindow(in, p.K, p.Stride, p.Pad, p.KH, p.KW, p.SH, p.SW, p.PadT, p.PadL, p.PadB, p.PadR)
	if err != nil {
		return nil, err
	}
	p.g = g
	p.dnnl.reset()
	p.KH, p.KW, p.SH, p.SW = g.kh, g.kw, g.sh, g.sw
	p.PadT, p.PadL, p.PadB, p.PadR = g.pt, g.pl, g.pb, g.pr
	return []int{g.ho, g.wo, g.c}, nil
}

// span returns the input rows (or columns) [lo, hi) that window o covers on
// an axis of n elements, with stride s, kernel k and leading pad pad.
func span(o, s, k, pad, n int) (lo, hi int) {
	lo = o*s - pad
	return max(lo, 0), min(lo+k, n)
}

// scale is the factor of a window's sum: 1/count.
func (p *AvgPool2D) scale(y0, y1, x0, x1 int) float32 {
	if p.CountIncludePad {
		return 1 / float32(p.g.kh*p.g.kw)
	}
	return 1 / float32((y1-y0)*(x1-x0))
}

func (p *AvgPool2D) Forward(c *Ctx, s *Slot, in []*Tensor) *Tensor {
	g := &p.g
	n := Rows(in[0])
	y := s.Buf(0, n, g.ho, g.wo, g.c)
	x, yd := F32(in[0]), F32(y)
	if fastPath(c) && p.dnnl.forward(c, s, g, p.dnnlAlg(), x, yd, n) {
		return y
	}
	parallel(threadsOf(c), n, 1, func(lo, hi int) {
		for b := lo; b < hi; b++ {
			for oy := 0; oy < g.ho; oy++ {
				y0, y1 := span(oy, g.sh, g.kh, g.pt, g.h)
				for ox := 0; ox < g.wo; ox++ {
					x0, x1 := span(ox, g.sw, g.kw, g.pl, g.w)
					o := ((b*g.ho+oy)*g.wo + ox) * g.c
					ys := yd[o : o+g.c]
					clear(ys)
					for iy := y0; iy < y1; iy++ {
						for ix := x0; ix < x1; ix++ {
							off := ((b*g.h+iy)*g.w + ix) * g.c
							xs := x[off : off+len(ys)]
							for i, v := range xs {
								ys[i] += v
							}
						}
					}
					f := p.scale(y0, y1, x0, x1)
					for i := range ys {
						ys[i] *= f
					}
				}
			}
		}
	})
	return y
}

func (p *AvgPool2D) Backward(c *Ctx, s *Slot, in []*Tensor, out, dout *Tensor, need []bool) []*Tensor {
	grads := s.Grads(1)
	if !need[0] {
		return grads
	}
	g := &p.g
	dx := s.Buf(1, in[0].Shape()...)
	d, dy := F32(dx), F32(dout)
	n := Rows(in[0])
	if fastPath(c) && p.dnnl.backward(c, s, g, p.dnnlAlg(), dy, d, n) {
		grads[0] = dx
		return grads
	}
	per := g.h * g.w * g.c
	// Windows of one sample touch only that sample's input: split by
	// sample; within one, the windows add in a fixed order.
	parallel(threadsOf(c), n, 1, func(lo, hi int) {
		clear(d[lo*per : hi*per])
		for b := lo; b < hi; b++ {
			for oy := 0; oy < g.ho; oy++ {
				y0, y1 := span(oy, g.sh, g.kh, g.pt, g.h)
				for ox := 0; ox < g.wo; ox++ {
					x0, x1 := span(ox, g.sw, g.kw, g.pl, g.w)
					o := ((b*g.ho+oy)*g.wo + ox) * g.c
					ys := dy[o : o+g.c]
					f := p.scale(y0, y1, x0, x1)
					for iy := y0; iy < y1; iy++ {
						for ix := x0; ix < x1; ix++ {
							off := ((b*g.h+iy)*g.w + ix) * g.c
							ds := d[off : off+len(ys)]
							for i, v := range ys {
								ds[i] += float32(v * f) // no fused multiply-add (arm64)
							}
						}
					}
				}
			}
		}
	})
	grads[0] = dx
	return grads
}

// GlobalAvgPool averages an [N, H, W, C] input over H and W to [N, C].
type GlobalAvgPool struct{ hw, c int }

func (p *GlobalAvgPool) Kind() string     { return "globalavgpool" }
func (p *GlobalAvgPool) Params() []*Param { return nil }
func (p *GlobalAvgPool) Build(in [][]int) ([]int, error) {
	if len(in) != 1 || len(in[0]) != 3 {
		return nil, fmt.Errorf("takes one [H, W, C] input, got %v", in)
	}
	p.hw, p.c = in[0][0]*in[0][1], in[0][2]
	return []int{p.c}, nil
}

func (p *GlobalAvgPool) Forward(c *Ctx, s *Slot, in []*Tensor) *Tensor {
	n := Rows(in[0])
	y := s.Buf(0, n, p.c)
	x, yd := F32(in[0]), F32(y)
	clear(yd)
	inv := 1 / float32(p.hw)
	for b := 0; b < n; b++ {
		ys := yd[b*p.c : (b+1)*p.c]
		for j := 0; j < p.hw; j++ {
			xs := x[(b*p.hw+j)*p.c : (b*p.hw+j+1)*p.c]
			for i, v := range xs {
				ys[i] += v
			}
		}
		for i := range ys {
			ys[i] *= inv
		}
	}
	return y
}

func (p *GlobalAvgPool) Backward(c *Ctx, s *Slot, in []*Tensor, out, dout *Tensor, need []bool) []*Tensor {
	g := s.Grads(1)
	if !need[0] {
		return g
	}
	dx := s.Buf(1, in[0].Shape()...)
	d, dy := F32(dx), F32(dout)
	n := Rows(in[0])
	inv := 1 / float32(p.hw)
	for b := 0; b < n; b++ {
		ys := dy[b*p.c : (b+1)*p.c]
		for j := 0; j < p.hw; j++ {
			ds := d[(b*p.hw+j)*p.c : (b*p.hw+j+1)*p.c]
			for i, v := range ys {
				ds[i] = v * inv
			}
		}
	}
	g[0] = dx
	return g
}
