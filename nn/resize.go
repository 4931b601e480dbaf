package nn

import (
	"fmt"
	"sync"
)

// Resize scales the height and width of an NHWC input, [H, W, C] to
// [Ho, Wo, C]: PyTorch's nn.Upsample and F.interpolate, ONNX's Resize.
//
// Ho is OutH when it is set, else H·ScaleH (and Wo likewise). Mode is
//
//   - "nearest": output o copies input floor(o·H/Ho), computed exactly in
//     integers: ONNX's nearest mode "floor" with coordinate transformation
//     "asymmetric", PyTorch's mode="nearest" (which computes the ratio in
//     float32 and agrees wherever H/Ho is an integer's reciprocal or exact);
//   - "linear": bilinear interpolation from the source coordinate
//     s = (o+½)·H/Ho − ½, clamped at 0 (PyTorch's align_corners=False, ONNX's
//     "pytorch_half_pixel"), or s = o·(H−1)/(Ho−1) with AlignCorners (ONNX's
//     "align_corners"). For Ho = 1 without AlignCorners it follows PyTorch,
//     s = (H−1)/2, where ONNX's pytorch_half_pixel takes s = 0.
//
// Each output element is computed in float64 and rounded once. The backward
// pass is the adjoint, gathered per input element over the outputs that
// read it, in ascending output order, in float64 and rounded once: no sum
// is split, whatever the thread count.
type Resize struct {
	Mode           string
	ScaleH, ScaleW int // integer factors, used when OutH (OutW) is 0
	OutH, OutW     int // output size; 0 means H·ScaleH (W·ScaleW)
	AlignCorners   bool

	h, w, c, ho, wo int
	ry, rx          resizeAxis
}

// resizeAxis maps one axis: output o reads inputs i0[o] and i1[o] with
// weights w0[o] and w1[o] (w1 is 0 when it reads one input only), and input
// i is read by outputs out[start[i]:start[i+1]] with weights wt[…].
type resizeAxis struct {
	i0, i1 []int32
	w0, w1 []float64
	start  []int32
	out    []int32
	wt     []float64
}

func (l *Resize) Kind() string     { return "resize" }
func (l *Resize) Params() []*Param { return nil }

func (l *Resize) Build(in [][]int) ([]int, error) {
	if len(in) != 1 || len(in[0]) != 3 {
		return nil, fmt.Errorf("takes one [H, W, C] input, got %v", in)
	}
	switch l.Mode {
	case "nearest":
		if l.AlignCorners {
			return nil, fmt.Errorf("align_corners needs mode linear, not %q", l.Mode)
		}
	case "linear":
	default:
		return nil, fmt.Errorf("unknown mode %q (want nearest or linear)", l.Mode)
	}
	l.h, l.w, l.c = in[0][0], in[0][1], in[0][2]
	size := func(n, out, scale int) int {
		if out != 0 {
			return out
		}
		return n * scale
	}
	l.ho, l.wo = size(l.h, l.OutH, l.ScaleH), size(l.w, l.OutW, l.ScaleW)
	if l.OutH < 0 || l.OutW < 0 || l.ScaleH < 0 || l.ScaleW < 0 || l.ho < 1 || l.wo < 1 || l.h < 1 || l.w < 1 {
		return nil, fmt.Errorf("cannot resize %v to %dx%d (scales %dx%d, sizes %dx%d)",
			in[0], l.ho, l.wo, l.ScaleH, l.ScaleW, l.OutH, l.OutW)
	}
	l.ry = l.axis(l.h, l.ho)
	l.rx = l.axis(l.w, l.wo)
	return []int{l.ho, l.wo, l.c}, nil
}

// axis builds the map of an axis from n inputs to m outputs.
func (l *Resize) axis(n, m int) resizeAxis {
	a := resizeAxis{
		i0: make([]int32, m), i1: make([]int32, m),
		w0: make([]float64, m), w1: make([]float64, m),
		start: make([]int32, n+1),
	}
	for o := 0; o < m; o++ {
		var i, frac int // the source coordinate is i + frac/den
		den := 1
		switch {
		case l.Mode == "nearest":
			i = o * n / m
		case l.AlignCorners:
			if m > 1 {
				den = m - 1
				i, frac = o*(n-1)/den, o*(n-1)%den
			}
		default:
			den = 2 * m
			if num := (2*o+1)*n - m; num > 0 {
				i, frac = num/den, num%den
			}
		}
		a.i0[o], a.i1[o], a.w0[o] = int32(i), int32(i), 1
		if frac != 0 && i+1 < n {
			t := float64(frac) / float64(den)
			a.i1[o], a.w0[o], a.w1[o] = int32(i+1), 1-t, t
		}
		a.start[a.i0[o]+1]++
		if a.w1[o] != 0 {
			a.start[a.i1[o]+1]++
		}
	}
	for i := 0; i < n; i++ {
		a.start[i+1] += a.start[i]
	}
	a.out = make([]int32, a.start[n])
	a.wt = make([]float64, a.start[n])
	next := append([]int32(nil), a.start[:n]...)
	for o := 0; o < m; o++ {
		for _, e := range []struct {
			i int32
			w float64
		}{{a.i0[o], a.w0[o]}, {a.i1[o], a.w1[o]}} {
			if e.w == 0 {
				continue
			}
			a.out[next[e.i]], a.wt[next[e.i]] = int32(o), e.w
			next[e.i]++
		}
	}
	return a
}

func (l *Resize) Forward(c *Ctx, s *Slot, in []*Tensor) *Tensor {
	n := Rows(in[0])
	y := s.Buf(0, n, l.ho, l.wo, l.c)
	x, yd := F32(in[0]), F32(y)
	C, h, w, ho, wo := l.c, l.h, l.w, l.ho, l.wo
	ry, rx := &l.ry, &l.rx
	nearest := l.Mode == "nearest"
	parallel(threadsOf(c), n*ho, max(1, cheapGrain/(wo*C)), func(lo, hi int) {
		for bo := lo; bo < hi; bo++ {
			b, oy := bo/ho, bo%ho
			r0 := x[(b*h+int(ry.i0[oy]))*w*C:][:w*C]
			r1 := x[(b*h+int(ry.i1[oy]))*w*C:][:w*C]
			wy0, wy1 := ry.w0[oy], ry.w1[oy]
			for ox := 0; ox < wo; ox++ {
				dst := yd[(bo*wo+ox)*C:][:C]
				x0, x1 := int(rx.i0[ox])*C, int(rx.i1[ox])*C
				if nearest {
					copy(dst, r0[x0:x0+C])
					continue
				}
				wx0, wx1 := rx.w0[ox], rx.w1[ox]
				w00, w01 := float64(wy0*wx0), float64(wy0*wx1)
				w10, w11 := float64(wy1*wx0), float64(wy1*wx1)
				a, bb := r0[x0:x0+C], r0[x1:x1+C]
				cc, d := r1[x0:x0+C], r1[x1:x1+C]
				for i := range dst {
					v := float64(w00*float64(a[i])) + float64(w01*float64(bb[i]))
					v += float64(w10 * float64(cc[i]))
					v += float64(w11 * float64(d[i]))
					dst[i] = float32(v)
				}
			}
		}
	})
	return y
}

// accPool holds float64 accumulators for Resize's backward pass, one per
// chunk in progress.
var accPool = sync.Pool{New: func() any { return new([]float64) }}

func (l *Resize) Backward(c *Ctx, s *Slot, in []*Tensor, out, dout *Tensor, need []bool) []*Tensor {
	g := s.Grads(1)
	if !need[0] {
		return g
	}
	n := Rows(in[0])
	dx := s.Buf(1, in[0].Shape()...)
	d, dy := F32(dx), F32(dout)
	C, h, w, ho, wo := l.c, l.h, l.w, l.ho, l.wo
	ry, rx := &l.ry, &l.rx
	// Each input row's share of the outputs is about ho·wo·C/h elements.
	grain := max(1, cheapGrain*h/(ho*wo*C))
	parallel(threadsOf(c), n*h, grain, func(lo, hi int) {
		sp := accPool.Get().(*[]float64)
		if cap(*sp) < C {
			*sp = make([]float64, C)
		}
		acc := (*sp)[:C]
		for bi := lo; bi < hi; bi++ {
			b, iy := bi/h, bi%h
			ys := ry.start[iy:][:2]
			for ix := 0; ix < w; ix++ {
				xs := rx.start[ix:][:2]
				clear(acc)
				for ey := ys[0]; ey < ys[1]; ey++ {
					row := dy[(b*ho+int(ry.out[ey]))*wo*C:][:wo*C]
					wy := ry.wt[ey]
					for ex := xs[0]; ex < xs[1]; ex++ {
						k := float64(wy * rx.wt[ex])
						src := row[int(rx.out[ex])*C:][:C]
						for i, v := range src {
							acc[i] += float64(k * float64(v))
						}
					}
				}
				dst := d[(bi*w+ix)*C:][:C]
				for i, v := range acc {
					dst[i] = float32(v)
				}
			}
		}
		accPool.Put(sp)
	})
	g[0] = dx
	return g
}
