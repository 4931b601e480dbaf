package nn

import (
	"fmt"
	"math"
)

// MaxPool2D takes the maximum over K×K windows of an NHWC input, moving by
// Stride, with Pad rows and columns of -Inf around it.
type MaxPool2D struct {
	K, Stride, Pad int
	h, w, c        int
	ho, wo         int
}

func (p *MaxPool2D) Kind() string     { return "maxpool2d" }
func (p *MaxPool2D) Params() []*Param { return nil }
func (p *MaxPool2D) Build(in [][]int) ([]int, error) {
	if len(in) != 1 || len(in[0]) != 3 {
		return nil, fmt.Errorf("takes one [H, W, C] input, got %v", in)
	}
	if p.Stride == 0 {
		p.Stride = p.K
	}
	if p.K < 1 || p.Stride < 1 || p.Pad < 0 || 2*p.Pad > p.K {
		return nil, fmt.Errorf("bad window k=%d stride=%d pad=%d", p.K, p.Stride, p.Pad)
	}
	p.h, p.w, p.c = in[0][0], in[0][1], in[0][2]
	p.ho = (p.h+2*p.Pad-p.K)/p.Stride + 1
	p.wo = (p.w+2*p.Pad-p.K)/p.Stride + 1
	if p.ho < 1 || p.wo < 1 {
		return nil, fmt.Errorf("input %v is smaller than the window %d", in[0], p.K)
	}
	return []int{p.ho, p.wo, p.c}, nil
}

func (p *MaxPool2D) Forward(c *Ctx, s *Slot, in []*Tensor) *Tensor {
	n := Rows(in[0])
	y := s.Buf(0, n, p.ho, p.wo, p.c)
	arg := s.Ints(0, n*p.ho*p.wo*p.c)
	x, yd := F32(in[0]), F32(y)
	parallel(threadsOf(c), n, 1, func(lo, hi int) {
		for b := lo; b < hi; b++ {
			for oy := 0; oy < p.ho; oy++ {
				for ox := 0; ox < p.wo; ox++ {
					o := ((b*p.ho+oy)*p.wo + ox) * p.c
					ys, as := yd[o:o+p.c], arg[o:o+p.c]
					for i := range ys {
						ys[i] = float32(math.Inf(-1))
						as[i] = -1
					}
					for ky := 0; ky < p.K; ky++ {
						iy := oy*p.Stride - p.Pad + ky
						if iy < 0 || iy >= p.h {
							continue
						}
						for kx := 0; kx < p.K; kx++ {
							ix := ox*p.Stride - p.Pad + kx
							if ix < 0 || ix >= p.w {
								continue
							}
							off := ((b*p.h+iy)*p.w + ix) * p.c
							xs := x[off : off+p.c]
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
	return y
}

func (p *MaxPool2D) Backward(c *Ctx, s *Slot, in []*Tensor, out, dout *Tensor, need []bool) []*Tensor {
	g := s.Grads(1)
	if !need[0] {
		return g
	}
	dx := s.ZeroBuf(1, in[0].Shape()...)
	d, dy := F32(dx), F32(dout)
	arg := s.Ints(0, len(dy))
	n := Rows(in[0])
	per := p.ho * p.wo * p.c
	// Windows of one sample touch only that sample's input: split by sample.
	parallel(threadsOf(c), n, 1, func(lo, hi int) {
		for i := lo * per; i < hi*per; i++ {
			d[arg[i]] += dy[i]
		}
	})
	g[0] = dx
	return g
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
