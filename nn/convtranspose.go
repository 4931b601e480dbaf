package nn

import "fmt"

// ConvTranspose2D is a 2-D transposed convolution of an NHWC input, PyTorch's
// ConvTranspose2d and ONNX's ConvTranspose: input channel i at (iy, ix),
// through kernel tap (ky, kx), adds to output (iy·SH − PadT + ky·DH,
// ix·SW − PadL + kx·DW), so that
//
//	Ho = (H−1)·SH − PadT − PadB + DH·(KH−1) + OutPadH + 1
//
// (and Wo likewise). Output positions that no tap reaches (output padding
// beyond the kernel's reach) hold the bias alone.
//
// It is the adjoint of a Conv2D with the same geometry from Out to In
// channels: its forward pass is that convolution's backward-data pass (one
// GEMM per group into a column matrix, then col2im), and its backward-data
// pass is that convolution's forward pass (im2col, then a GEMM). The
// weights are stored [In, KH, KW, Out/Groups], the OHWI layout of that
// convolution, and exported as PyTorch's [In, Out/Groups, KH, KW].
//
// The zero value of a stride, dilation or Groups means 1; Build fills them
// in. With Groups g, In and Out must be multiples of g, and input channel i
// feeds only output channels [i/(In/g)·Out/g, (i/(In/g)+1)·Out/g).
type ConvTranspose2D struct {
	In, Out                int
	KH, KW                 int // kernel height and width
	SH, SW                 int // strides; 0 means 1
	PadT, PadL, PadB, PadR int // rows and columns cropped off each side
	OutPadH, OutPadW       int // rows and columns added at the bottom and right
	DH, DW                 int // dilations; 0 means 1
	Groups                 int // 0 means 1
	Bias                   bool
	// OneD is PyTorch's ConvTranspose1d as one of height 1 (KH 1): its
	// weight is exported as [In, Out/Groups, KW].
	OneD bool

	W, B *Param

	h, w, ho, wo int
	// adj is the adjoint convolution, from the output [ho, wo, Out] to the
	// input [h, w, In]: its im2col and col2im do the spatial work.
	adj Conv2D
	col Slot // scratch for the column matrix, shared by all slots
}

func (l *ConvTranspose2D) Kind() string { return "convtranspose2d" }

func (l *ConvTranspose2D) Build(in [][]int) ([]int, error) {
	if len(in) != 1 || len(in[0]) != 3 {
		return nil, fmt.Errorf("takes one [H, W, C] input, got %v", in)
	}
	if in[0][2] != l.In {
		return nil, fmt.Errorf("input %v has %d channels, want %d", in[0], in[0][2], l.In)
	}
	for _, f := range []*int{&l.SH, &l.SW, &l.DH, &l.DW, &l.Groups} {
		if *f == 0 {
			*f = 1
		}
	}
	if l.KH < 1 || l.KW < 1 || l.SH < 1 || l.SW < 1 || l.DH < 1 || l.DW < 1 || l.Out < 1 ||
		l.PadT < 0 || l.PadL < 0 || l.PadB < 0 || l.PadR < 0 || l.OutPadH < 0 || l.OutPadW < 0 {
		return nil, fmt.Errorf("bad kernel %dx%d stride %dx%d pads (%d,%d,%d,%d) output padding %dx%d dilation %dx%d out=%d",
			l.KH, l.KW, l.SH, l.SW, l.PadT, l.PadL, l.PadB, l.PadR, l.OutPadH, l.OutPadW, l.DH, l.DW, l.Out)
	}
	if l.Groups < 1 || l.In%l.Groups != 0 || l.Out%l.Groups != 0 {
		return nil, fmt.Errorf("groups=%d does not divide in=%d and out=%d", l.Groups, l.In, l.Out)
	}
	l.h, l.w = in[0][0], in[0][1]
	l.ho = (l.h-1)*l.SH - l.PadT - l.PadB + l.DH*(l.KH-1) + l.OutPadH + 1
	l.wo = (l.w-1)*l.SW - l.PadL - l.PadR + l.DW*(l.KW-1) + l.OutPadW + 1
	if l.h < 1 || l.w < 1 || l.ho < 1 || l.wo < 1 {
		return nil, fmt.Errorf("input %v gives an empty output %dx%d", in[0], l.ho, l.wo)
	}
	l.adj = Conv2D{
		In: l.Out, Out: l.In, KH: l.KH, KW: l.KW, SH: l.SH, SW: l.SW,
		PadT: l.PadT, PadL: l.PadL, PadB: l.PadB, PadR: l.PadR, DH: l.DH, DW: l.DW, Groups: l.Groups,
		h: l.ho, w: l.wo, ho: l.h, wo: l.w,
	}
	// PyTorch's fan-in for ConvTranspose2d: weight.size(1)·KH·KW.
	fan := l.Out / l.Groups * l.KH * l.KW
	// Exported as PyTorch's [In, Out/Groups, KH, KW], or [In, Out/Groups, KW].
	shape, layout := []int{l.In, l.KH, l.KW, l.Out / l.Groups}, []int{0, 3, 1, 2}
	if l.OneD {
		if l.KH != 1 {
			return nil, fmt.Errorf("a 1-D transposed convolution of kernel height %d", l.KH)
		}
		shape, layout = []int{l.In, l.KW, l.Out / l.Groups}, []int{0, 2, 1}
	}
	l.W = newParam(shape, InitUniform, fan)
	l.W.Name, l.W.Layout = "weight", layout
	l.B = nil
	if l.Bias {
		l.B = newParam([]int{l.Out}, InitUniform, fan)
		l.B.Name = "bias"
	}
	return []int{l.ho, l.wo, l.Out}, nil
}

func (l *ConvTranspose2D) Params() []*Param {
	if l.Bias {
		return []*Param{l.W, l.B}
	}
	return []*Param{l.W}
}

// direct reports whether the output itself is the column matrix: a 1×1
// kernel with stride 1 and no cropping or output padding.
func (l *ConvTranspose2D) direct() bool {
	return l.KH == 1 && l.KW == 1 && l.SH == 1 && l.SW == 1 &&
		l.PadT == 0 && l.PadL == 0 && l.PadB == 0 && l.PadR == 0 && l.OutPadH == 0 && l.OutPadW == 0
}

// The column matrix has one row per input position (n·h·w rows) and
// kc = KH·KW·Out columns, group gi's gk = kc/Groups columns from gi·gk:
// the adjoint convolution's im2col layout. Group gi's weights are rows
// [gi·gin, (gi+1)·gin) of W, gin = In/Groups, each gk long.

func (l *ConvTranspose2D) Forward(c *Ctx, s *Slot, in []*Tensor) *Tensor {
	x := in[0]
	n := Rows(x)
	rows, kc := n*l.h*l.w, l.KH*l.KW*l.Out
	gk, gin := kc/l.Groups, l.In/l.Groups
	y := s.Buf(0, n, l.ho, l.wo, l.Out)
	yd := F32(y)
	col := yd
	if !l.direct() {
		col = F32(l.col.Buf(0, rows, kc))
	}
	xd, w := F32(x), F32(l.W.Value)
	for gi := 0; gi < l.Groups; gi++ {
		c.Backend.Sgemm(false, false, rows, gk, gin, 1, xd[gi*gin:], l.In, w[gi*gin*gk:], gk, 0, col[gi*gk:], kc)
	}
	if !l.direct() {
		l.adj.col2im(c, col, yd, n)
	}
	if l.Bias {
		b := F32(l.B.Value)
		parallel(threadsOf(c), n*l.ho*l.wo, max(1, cheapGrain/l.Out), func(lo, hi int) {
			for r := lo; r < hi; r++ {
				addVec(yd[r*l.Out:(r+1)*l.Out], b, yd[r*l.Out:(r+1)*l.Out])
			}
		})
	}
	return y
}

func (l *ConvTranspose2D) Backward(c *Ctx, s *Slot, in []*Tensor, out, dout *Tensor, need []bool) []*Tensor {
	x := in[0]
	n := Rows(x)
	rows, kc := n*l.h*l.w, l.KH*l.KW*l.Out
	gk, gin := kc/l.Groups, l.In/l.Groups
	dy := F32(dout)
	dcol := dy
	if !l.direct() {
		dcol = F32(l.col.Buf(0, rows, kc))
		l.adj.im2col(c, dy, dcol, n)
	}
	xd, dw, w := F32(x), F32(l.W.Grad), F32(l.W.Value)
	for gi := 0; gi < l.Groups; gi++ {
		c.Backend.Sgemm(true, false, gin, gk, rows, 1, xd[gi*gin:], l.In, dcol[gi*gk:], kc, 1, dw[gi*gin*gk:], gk)
	}
	if l.Bias {
		colSumAdd(F32(l.B.Grad), dy, n*l.ho*l.wo, l.Out)
	}
	g := s.Grads(1)
	if !need[0] {
		return g
	}
	dx := s.Buf(1, x.Shape()...)
	dxd := F32(dx)
	for gi := 0; gi < l.Groups; gi++ {
		c.Backend.Sgemm(false, true, rows, gin, gk, 1, dcol[gi*gk:], kc, w[gi*gin*gk:], gk, 0, dxd[gi*gin:], l.In)
	}
	g[0] = dx
	return g
}
