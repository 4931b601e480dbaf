package nn

import "fmt"

// Conv2D is a 2-D convolution of an NHWC input with weights [Out, K, K, In]
// (OHWI), moving by Stride with Pad zeros around the input. A 1×1 convolution
// with stride 1 is one GEMM on the input; others go through im2col.
type Conv2D struct {
	In, Out, K, Stride, Pad int
	Bias                    bool

	W, B   *Param
	h, w   int
	ho, wo int
	dcol   Slot // scratch for the column gradient, shared by all slots
}

// NewConv2D returns a convolution without bias (it is followed by
// BatchNorm in the zoo's models).
func NewConv2D(in, out, k, stride, pad int) *Conv2D {
	return &Conv2D{In: in, Out: out, K: k, Stride: stride, Pad: pad}
}

func (l *Conv2D) Kind() string { return "conv2d" }

func (l *Conv2D) Build(in [][]int) ([]int, error) {
	if len(in) != 1 || len(in[0]) != 3 {
		return nil, fmt.Errorf("takes one [H, W, C] input, got %v", in)
	}
	if in[0][2] != l.In {
		return nil, fmt.Errorf("input %v has %d channels, want %d", in[0], in[0][2], l.In)
	}
	if l.Stride == 0 {
		l.Stride = 1
	}
	if l.K < 1 || l.Stride < 1 || l.Pad < 0 || l.Out < 1 {
		return nil, fmt.Errorf("bad kernel k=%d stride=%d pad=%d out=%d", l.K, l.Stride, l.Pad, l.Out)
	}
	l.h, l.w = in[0][0], in[0][1]
	l.ho = (l.h+2*l.Pad-l.K)/l.Stride + 1
	l.wo = (l.w+2*l.Pad-l.K)/l.Stride + 1
	if l.ho < 1 || l.wo < 1 {
		return nil, fmt.Errorf("input %v is smaller than the kernel %d", in[0], l.K)
	}
	fan := l.In * l.K * l.K
	l.W = newParam([]int{l.Out, l.K, l.K, l.In}, InitHe, fan)
	l.W.Name = "weight"
	if l.Bias {
		l.B = newParam([]int{l.Out}, InitZero, fan)
		l.B.Name = "bias"
	}
	return []int{l.ho, l.wo, l.Out}, nil
}

func (l *Conv2D) Params() []*Param {
	if l.Bias {
		return []*Param{l.W, l.B}
	}
	return []*Param{l.W}
}

// direct reports whether the input itself is the column matrix.
func (l *Conv2D) direct() bool { return l.K == 1 && l.Stride == 1 && l.Pad == 0 }

func (l *Conv2D) Forward(c *Ctx, s *Slot, in []*Tensor) *Tensor {
	x := in[0]
	n := Rows(x)
	rows, kc := n*l.ho*l.wo, l.K*l.K*l.In
	col := F32(x)
	if !l.direct() {
		col = F32(s.Buf(1, rows, kc))
		l.im2col(c, F32(x), col, n)
	}
	y := s.Buf(0, n, l.ho, l.wo, l.Out)
	yd := F32(y)
	beta := float32(0)
	if l.Bias {
		b := F32(l.B.Value)
		for r := 0; r < rows; r++ {
			copy(yd[r*l.Out:(r+1)*l.Out], b)
		}
		beta = 1
	}
	c.Backend.Sgemm(false, true, rows, l.Out, kc, 1, col, kc, F32(l.W.Value), kc, beta, yd, l.Out)
	return y
}

func (l *Conv2D) Backward(c *Ctx, s *Slot, in []*Tensor, out, dout *Tensor, need []bool) []*Tensor {
	x := in[0]
	n := Rows(x)
	rows, kc := n*l.ho*l.wo, l.K*l.K*l.In
	col := F32(x)
	if !l.direct() {
		col = F32(s.Buf(1, rows, kc))
	}
	dy := F32(dout)
	c.Backend.Sgemm(true, false, l.Out, kc, rows, 1, dy, l.Out, col, kc, 1, F32(l.W.Grad), kc)
	if l.Bias {
		colSumAdd(F32(l.B.Grad), dy, rows, l.Out)
	}
	g := s.Grads(1)
	if !need[0] {
		return g
	}
	dx := s.Buf(2, x.Shape()...)
	if l.direct() {
		c.Backend.Sgemm(false, false, rows, kc, l.Out, 1, dy, l.Out, F32(l.W.Value), kc, 0, F32(dx), kc)
	} else {
		dcol := F32(l.dcol.Buf(0, rows, kc))
		c.Backend.Sgemm(false, false, rows, kc, l.Out, 1, dy, l.Out, F32(l.W.Value), kc, 0, dcol, kc)
		l.col2im(c, dcol, F32(dx), n)
	}
	g[0] = dx
	return g
}

// im2col writes, for every output position (row), the K×K×In input values
// it sees, zeros outside the input.
func (l *Conv2D) im2col(c *Ctx, x, col []float32, n int) {
	C, K := l.In, l.K
	kc := K * K * C
	parallel(threadsOf(c), n*l.ho, 4, func(lo, hi int) {
		for bo := lo; bo < hi; bo++ {
			b, oy := bo/l.ho, bo%l.ho
			for ox := 0; ox < l.wo; ox++ {
				row := col[(bo*l.wo+ox)*kc : (bo*l.wo+ox+1)*kc]
				for ky := 0; ky < K; ky++ {
					iy := oy*l.Stride - l.Pad + ky
					dst := row[ky*K*C : (ky+1)*K*C]
					if iy < 0 || iy >= l.h {
						clear(dst)
						continue
					}
					ix0 := ox*l.Stride - l.Pad
					if ix0 >= 0 && ix0+K <= l.w {
						off := ((b*l.h+iy)*l.w + ix0) * C
						copy(dst, x[off:off+K*C])
						continue
					}
					for kx := 0; kx < K; kx++ {
						ix := ix0 + kx
						d := dst[kx*C : (kx+1)*C]
						if ix < 0 || ix >= l.w {
							clear(d)
						} else {
							off := ((b*l.h+iy)*l.w + ix) * C
							copy(d, x[off:off+C])
						}
					}
				}
			}
		}
	})
}

// col2im sums the column gradient back into the input gradient. Each
// sample's rows touch only that sample, so samples run in parallel; within a
// sample the order is fixed.
func (l *Conv2D) col2im(c *Ctx, dcol, dx []float32, n int) {
	C, K := l.In, l.K
	kc := K * K * C
	per := l.h * l.w * C
	parallel(threadsOf(c), n, 1, func(lo, hi int) {
		clear(dx[lo*per : hi*per])
		for b := lo; b < hi; b++ {
			for oy := 0; oy < l.ho; oy++ {
				for ox := 0; ox < l.wo; ox++ {
					row := dcol[((b*l.ho+oy)*l.wo+ox)*kc:]
					for ky := 0; ky < K; ky++ {
						iy := oy*l.Stride - l.Pad + ky
						if iy < 0 || iy >= l.h {
							continue
						}
						for kx := 0; kx < K; kx++ {
							ix := ox*l.Stride - l.Pad + kx
							if ix < 0 || ix >= l.w {
								continue
							}
							src := row[(ky*K+kx)*C : (ky*K+kx+1)*C]
							dst := dx[((b*l.h+iy)*l.w+ix)*C:]
							dst = dst[:C]
							for i, v := range src {
								dst[i] += v
							}
						}
					}
				}
			}
		}
	})
}
