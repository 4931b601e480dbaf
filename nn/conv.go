package nn

import "fmt"

// Conv2D is a 2-D convolution of an NHWC input with weights
// [Out, KH, KW, In/Groups] (OHWI), the general convolution of PyTorch's
// Conv2d: rectangular kernels, strides per axis, padding per side (zeros),
// dilation and groups.
//
// The zero value of each geometry field means its default: KH and KW are K;
// SH and SW are Stride, or 1 when Stride is 0; PadT, PadL, PadB and PadR
// (top, left, bottom, right) are each Pad when all four are zero; DH and DW
// (dilations) are 1; Groups is 1. Build fills the defaults in. With Groups g,
// In and Out must be multiples of g, and output channel o sees only input
// channels [o/(Out/g)·In/g, (o/(Out/g)+1)·In/g).
//
// A 1×1 convolution with stride 1 and no padding is one GEMM per group on
// the input itself; others go through im2col, whose rows hold, group after
// group, each group's KH×KW×In/g window, so that every group is one GEMM
// writing its block of output channels.
type Conv2D struct {
	In, Out, K, Stride, Pad int
	Bias                    bool

	KH, KW                 int // kernel height and width; 0 means K
	SH, SW                 int // strides; 0 means Stride (or 1)
	PadT, PadL, PadB, PadR int // zeros before and after each axis; all 0 means Pad
	DH, DW                 int // dilations; 0 means 1
	Groups                 int // 0 means 1
	// OneD is PyTorch's Conv1d as a convolution of height 1 (KH 1): its
	// weight is exported as [Out, In/Groups, KW].
	OneD bool

	W, B   *Param
	h, w   int
	ho, wo int
	dcol   Slot     // scratch for the column gradient, shared by all slots
	dnnl   dnnlConv // oneDNN's primitives (see fastPath)
}

// NewConv2D returns a square convolution without bias (it is followed by
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
	if l.KH == 0 {
		l.KH = l.K
	}
	if l.KW == 0 {
		l.KW = l.K
	}
	if l.SH == 0 {
		l.SH = l.Stride
	}
	if l.SW == 0 {
		l.SW = l.Stride
	}
	if l.PadT == 0 && l.PadL == 0 && l.PadB == 0 && l.PadR == 0 {
		l.PadT, l.PadL, l.PadB, l.PadR = l.Pad, l.Pad, l.Pad, l.Pad
	}
	if l.DH == 0 {
		l.DH = 1
	}
	if l.DW == 0 {
		l.DW = 1
	}
	if l.Groups == 0 {
		l.Groups = 1
	}
	if l.K < 0 || l.KH < 1 || l.KW < 1 || l.Stride < 1 || l.SH < 1 || l.SW < 1 || l.Pad < 0 ||
		l.PadT < 0 || l.PadL < 0 || l.PadB < 0 || l.PadR < 0 || l.DH < 1 || l.DW < 1 || l.Out < 1 {
		return nil, fmt.Errorf("bad kernel %dx%d stride %dx%d pads (%d,%d,%d,%d) dilation %dx%d out=%d",
			l.KH, l.KW, l.SH, l.SW, l.PadT, l.PadL, l.PadB, l.PadR, l.DH, l.DW, l.Out)
	}
	if l.Groups < 1 || l.In%l.Groups != 0 || l.Out%l.Groups != 0 {
		return nil, fmt.Errorf("groups=%d does not divide in=%d and out=%d", l.Groups, l.In, l.Out)
	}
	l.dnnl.reset()
	l.h, l.w = in[0][0], in[0][1]
	eh, ew := l.DH*(l.KH-1)+1, l.DW*(l.KW-1)+1 // the dilated kernel's extent
	if l.h+l.PadT+l.PadB < eh || l.w+l.PadL+l.PadR < ew {
		return nil, fmt.Errorf("input %v is smaller than the kernel %dx%d", in[0], eh, ew)
	}
	l.ho = (l.h+l.PadT+l.PadB-eh)/l.SH + 1
	l.wo = (l.w+l.PadL+l.PadR-ew)/l.SW + 1
	cin := l.In / l.Groups
	fan := cin * l.KH * l.KW
	// Exported as PyTorch's [Out, In/Groups, KH, KW], or [Out, In/Groups, KW].
	shape, layout := []int{l.Out, l.KH, l.KW, cin}, []int{0, 3, 1, 2}
	if l.OneD {
		if l.KH != 1 {
			return nil, fmt.Errorf("a 1-D convolution of kernel height %d", l.KH)
		}
		shape, layout = []int{l.Out, l.KW, cin}, []int{0, 2, 1}
	}
	l.W = newParam(shape, InitHe, fan)
	l.W.Name, l.W.Layout = "weight", layout
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

// direct reports whether the input itself is the column matrix: a 1×1
// kernel's window is one pixel's channels, which are already group after
// group.
func (l *Conv2D) direct() bool {
	return l.KH == 1 && l.KW == 1 && l.SH == 1 && l.SW == 1 &&
		l.PadT == 0 && l.PadL == 0 && l.PadB == 0 && l.PadR == 0
}

// The column matrix has one row per output position and kc = KH·KW·In
// columns, group gi's gk = kc/Groups columns from gi·gk. Group gi's weights
// are rows [gi·gout, (gi+1)·gout) of W, gout = Out/Groups, each gk long.

func (l *Conv2D) Forward(c *Ctx, s *Slot, in []*Tensor) *Tensor {
	x := in[0]
	n := Rows(x)
	if fastPath(c) {
		y := s.Buf(0, n, l.ho, l.wo, l.Out)
		if l.dnnl.forward(c, l, F32(x), F32(y), n) {
			return y
		}
	}
	rows, kc := n*l.ho*l.wo, l.KH*l.KW*l.In
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
	gk, gout := kc/l.Groups, l.Out/l.Groups
	w := F32(l.W.Value)
	for gi := 0; gi < l.Groups; gi++ {
		c.Backend.Sgemm(false, true, rows, gout, gk, 1, col[gi*gk:], kc, w[gi*gout*gk:], gk, beta, yd[gi*gout:], l.Out)
	}
	return y
}

func (l *Conv2D) Backward(c *Ctx, s *Slot, in []*Tensor, out, dout *Tensor, need []bool) []*Tensor {
	x := in[0]
	n := Rows(x)
	if fastPath(c) {
		var dx *Tensor
		var dxd []float32
		if need[0] {
			dx = s.Buf(2, x.Shape()...)
			dxd = F32(dx)
		}
		// A frozen convolution's weight gradients are not computed.
		if l.dnnl.backward(c, l, F32(x), F32(dout), dxd, n, l.trains()) {
			g := s.Grads(1)
			g[0] = dx
			return g
		}
	}
	if l.trains() {
		l.BackwardWeight(c, s, in, out, dout)
	}
	return l.BackwardInput(c, s, in, out, dout, need)
}

// trains reports whether a parameter of l trains (see Frozen).
func (l *Conv2D) trains() bool { return l.W.Trainable() || l.Bias && l.B.Trainable() }

// Splits: a convolution splits its backward pass (SplitLayer) but on the
// fast path, where oneDNN computes both halves at once.
func (l *Conv2D) Splits(c *Ctx) bool { return !fastPath(c) }

// BackwardWeight adds dW and db, from the im2col columns Forward left.
func (l *Conv2D) BackwardWeight(c *Ctx, s *Slot, in []*Tensor, out, dout *Tensor) {
	x := in[0]
	n := Rows(x)
	rows, kc := n*l.ho*l.wo, l.KH*l.KW*l.In
	gk, gout := kc/l.Groups, l.Out/l.Groups
	col := F32(x)
	if !l.direct() {
		col = F32(s.Buf(1, rows, kc))
	}
	dy := F32(dout)
	dw := F32(l.W.Grad)
	for gi := 0; gi < l.Groups; gi++ {
		c.Backend.Sgemm(true, false, gout, gk, rows, 1, dy[gi*gout:], l.Out, col[gi*gk:], kc, 1, dw[gi*gout*gk:], gk)
	}
	if l.Bias {
		colSumAdd(F32(l.B.Grad), dy, rows, l.Out)
	}
}

// BackwardInput returns dx (off the fast path).
func (l *Conv2D) BackwardInput(c *Ctx, s *Slot, in []*Tensor, out, dout *Tensor, need []bool) []*Tensor {
	x := in[0]
	n := Rows(x)
	rows, kc := n*l.ho*l.wo, l.KH*l.KW*l.In
	gk, gout := kc/l.Groups, l.Out/l.Groups
	dy := F32(dout)
	w := F32(l.W.Value)
	g := s.Grads(1)
	if !need[0] {
		return g
	}
	dx := s.Buf(2, x.Shape()...)
	dcol := F32(dx)
	if !l.direct() {
		dcol = F32(l.dcol.Buf(0, rows, kc))
	}
	for gi := 0; gi < l.Groups; gi++ {
		c.Backend.Sgemm(false, false, rows, gk, gout, 1, dy[gi*gout:], l.Out, w[gi*gout*gk:], gk, 0, dcol[gi*gk:], kc)
	}
	if !l.direct() {
		l.col2im(c, dcol, F32(dx), n)
	}
	g[0] = dx
	return g
}

// im2col writes, for every output position (row), the input values each
// group's window sees, zeros outside the input.
func (l *Conv2D) im2col(c *Ctx, x, col []float32, n int) {
	C, KH, KW, G := l.In, l.KH, l.KW, l.Groups
	h, w, ho, wo := l.h, l.w, l.ho, l.wo
	sh, sw, pt, pl, dh, dw := l.SH, l.SW, l.PadT, l.PadL, l.DH, l.DW
	cg := C / G
	kc := KH * KW * C
	gk := kc / G
	if G == 1 {
		// The common case on its own: a row is the window's KH×KW×C values.
		run := KW * C // one kernel row's values
		parallel(threadsOf(c), n*ho, 4, func(lo, hi int) {
			for bo := lo; bo < hi; bo++ {
				b, oy := bo/ho, bo%ho
				for ox := 0; ox < wo; ox++ {
					row := col[(bo*wo+ox)*kc : (bo*wo+ox+1)*kc]
					ix0 := ox*sw - pl
					// Inside the input without dilation, a kernel row is one
					// run of the input too.
					inside := dw == 1 && ix0 >= 0 && ix0+KW <= w
					iy := oy*sh - pt
					for ky := 0; ky < KH; ky, iy = ky+1, iy+dh {
						dst := row[ky*run : (ky+1)*run]
						if iy < 0 || iy >= h {
							clear(dst)
							continue
						}
						base := (b*h + iy) * w
						if inside {
							off := (base + ix0) * C
							copy(dst, x[off:off+run])
							continue
						}
						for kx := 0; kx < KW; kx++ {
							ix := ix0 + kx*dw
							d := dst[kx*C : (kx+1)*C]
							if ix < 0 || ix >= w {
								clear(d)
							} else {
								copy(d, x[(base+ix)*C:(base+ix+1)*C])
							}
						}
					}
				}
			}
		})
		return
	}
	// Groups: a row is group 0's KH×KW×cg values, then group 1's, and so on.
	parallel(threadsOf(c), n*ho, 4, func(lo, hi int) {
		for bo := lo; bo < hi; bo++ {
			b, oy := bo/ho, bo%ho
			for ox := 0; ox < wo; ox++ {
				row := col[(bo*wo+ox)*kc : (bo*wo+ox+1)*kc]
				ix0 := ox*sw - pl
				for ky := 0; ky < KH; ky++ {
					iy := oy*sh - pt + ky*dh
					if iy < 0 || iy >= h {
						for gi := 0; gi < G; gi++ {
							clear(row[gi*gk+ky*KW*cg : gi*gk+(ky+1)*KW*cg])
						}
						continue
					}
					base := (b*h + iy) * w
					for kx := 0; kx < KW; kx++ {
						ix := ix0 + kx*dw
						at := (ky*KW + kx) * cg
						if ix < 0 || ix >= w {
							for gi := 0; gi < G; gi++ {
								clear(row[gi*gk+at : gi*gk+at+cg])
							}
							continue
						}
						src := x[(base+ix)*C : (base+ix+1)*C]
						if cg == 1 {
							for gi, v := range src {
								row[gi*gk+at] = v
							}
							continue
						}
						for gi := 0; gi < G; gi++ {
							copy(row[gi*gk+at:gi*gk+at+cg], src[gi*cg:(gi+1)*cg])
						}
					}
				}
			}
		}
	})
}

// col2im sums the column gradient back into the input gradient. Each
// sample's rows touch only that sample, so samples run in parallel; within a
// sample the order is fixed: every input element receives its terms in
// ascending (oy, ox, ky, kx).
func (l *Conv2D) col2im(c *Ctx, dcol, dx []float32, n int) {
	C, KH, KW, G := l.In, l.KH, l.KW, l.Groups
	h, w, ho, wo := l.h, l.w, l.ho, l.wo
	sh, sw, pt, pl, dh, dw := l.SH, l.SW, l.PadT, l.PadL, l.DH, l.DW
	cg := C / G
	kc := KH * KW * C
	gk := kc / G
	per := h * w * C
	contiguous := G == 1 && dw == 1
	parallel(threadsOf(c), n, 1, func(lo, hi int) {
		clear(dx[lo*per : hi*per])
		for b := lo; b < hi; b++ {
			for oy := 0; oy < ho; oy++ {
				for ox := 0; ox < wo; ox++ {
					row := dcol[((b*ho+oy)*wo+ox)*kc : ((b*ho+oy)*wo+ox+1)*kc]
					ix0 := ox*sw - pl
					inside := contiguous && ix0 >= 0 && ix0+KW <= w
					for ky := 0; ky < KH; ky++ {
						iy := oy*sh - pt + ky*dh
						if iy < 0 || iy >= h {
							continue
						}
						base := (b*h + iy) * w
						if inside {
							// Distinct (kx, channel) pairs: one run.
							src := row[ky*KW*C : (ky+1)*KW*C]
							d := dx[(base+ix0)*C:][:len(src)]
							addVec(d, src, d)
							continue
						}
						for kx := 0; kx < KW; kx++ {
							ix := ix0 + kx*dw
							if ix < 0 || ix >= w {
								continue
							}
							at := (ky*KW + kx) * cg
							dst := dx[(base+ix)*C : (base+ix+1)*C]
							for gi := 0; gi < G; gi++ {
								src := row[gi*gk+at : gi*gk+at+cg]
								d := dst[gi*cg:][:len(src)]
								addVec(d, src, d)
							}
						}
					}
				}
			}
		}
	})
}
