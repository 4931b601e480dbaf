package nn

import (
	"fmt"
	"math"
)

// Elementwise loops split the elements into chunks of at least this many:
// cheapGrain for arithmetic, mathGrain for loops that call exp or erf.
const (
	cheapGrain = 1 << 15
	mathGrain  = 1 << 13
)

// zipChunks runs f over matching chunks of dst, a and b (b may be nil), in
// parallel; each chunk writes only its part of dst.
func zipChunks(c *Ctx, grain int, dst, a, b []float32, f func(dst, a, b []float32)) {
	parallel(threadsOf(c), len(dst), grain, func(lo, hi int) {
		var bs []float32
		if b != nil {
			bs = b[lo:hi]
		}
		f(dst[lo:hi], a[lo:hi], bs)
	})
}

// unaryForward returns buffer 0 of s set to f(x) chunk by chunk.
func unaryForward(c *Ctx, s *Slot, x *Tensor, grain int, f func(y, x, _ []float32)) *Tensor {
	y := s.Buf(0, x.Shape()...)
	zipChunks(c, grain, F32(y), F32(x), nil, f)
	return y
}

// unaryBackward returns the input gradient in buffer 1 of s, computed chunk
// by chunk by f(dx, dy, a), where a is the saved tensor f needs (the input
// or the output), or nothing when need[0] is unset.
func unaryBackward(c *Ctx, s *Slot, dout *Tensor, a []float32, need []bool, grain int, f func(dx, dy, a []float32)) []*Tensor {
	g := s.Grads(1)
	if !need[0] {
		return g
	}
	dx := s.Buf(1, dout.Shape()...)
	zipChunks(c, grain, F32(dx), F32(dout), a, f)
	g[0] = dx
	return g
}

// Sigmoid is y = 1/(1+exp(-x)), computed in float64 (sigmoidFast) and
// rounded once.
type Sigmoid struct{}

func (Sigmoid) Kind() string                    { return "sigmoid" }
func (Sigmoid) Params() []*Param                { return nil }
func (Sigmoid) Build(in [][]int) ([]int, error) { return oneInput(in) }

func (Sigmoid) Forward(c *Ctx, s *Slot, in []*Tensor) *Tensor {
	return unaryForward(c, s, in[0], mathGrain, func(y, x, _ []float32) {
		sigmoidRange(x, y[:len(x)])
	})
}

// Backward uses dy·y·(1-y) from the saved output.
func (Sigmoid) Backward(c *Ctx, s *Slot, in []*Tensor, out, dout *Tensor, need []bool) []*Tensor {
	return unaryBackward(c, s, dout, F32(out), need, cheapGrain, func(dx, dy, y []float32) {
		dx, y = dx[:len(dy)], y[:len(dy)]
		for i, d := range dy {
			v := float64(y[i])
			dx[i] = float32(float64(d) * v * (1 - v))
		}
	})
}

// Tanh is y = tanh(x), computed in float64 (tanhFast) and rounded once.
type Tanh struct{}

func (Tanh) Kind() string                    { return "tanh" }
func (Tanh) Params() []*Param                { return nil }
func (Tanh) Build(in [][]int) ([]int, error) { return oneInput(in) }

func (Tanh) Forward(c *Ctx, s *Slot, in []*Tensor) *Tensor {
	return unaryForward(c, s, in[0], mathGrain, func(y, x, _ []float32) {
		tanhRange(x, y[:len(x)])
	})
}

// Backward uses dy·(1-y²) from the saved output.
func (Tanh) Backward(c *Ctx, s *Slot, in []*Tensor, out, dout *Tensor, need []bool) []*Tensor {
	return unaryBackward(c, s, dout, F32(out), need, cheapGrain, func(dx, dy, y []float32) {
		dx, y = dx[:len(dy)], y[:len(dy)]
		for i, d := range dy {
			v := float64(y[i])
			dx[i] = float32(float64(d) * (1 - float64(v*v)))
		}
	})
}

// LeakyReLU is y = x for x > 0 and Alpha·x otherwise, as PyTorch's
// leaky_relu (whose default Alpha is 0.01; the zero value here is ReLU).
type LeakyReLU struct{ Alpha float32 }

func (LeakyReLU) Kind() string                    { return "leakyrelu" }
func (LeakyReLU) Params() []*Param                { return nil }
func (LeakyReLU) Build(in [][]int) ([]int, error) { return oneInput(in) }

func (l LeakyReLU) Forward(c *Ctx, s *Slot, in []*Tensor) *Tensor {
	a := l.Alpha
	return unaryForward(c, s, in[0], cheapGrain, func(y, x, _ []float32) {
		y = y[:len(x)]
		for i, v := range x {
			if v > 0 {
				y[i] = v
			} else {
				y[i] = v * a
			}
		}
	})
}

// Backward tests the saved input, not the output, so that any Alpha works.
func (l LeakyReLU) Backward(c *Ctx, s *Slot, in []*Tensor, out, dout *Tensor, need []bool) []*Tensor {
	a := l.Alpha
	return unaryBackward(c, s, dout, F32(in[0]), need, cheapGrain, func(dx, dy, x []float32) {
		dx, x = dx[:len(dy)], x[:len(dy)]
		for i, d := range dy {
			if x[i] > 0 {
				dx[i] = d
			} else {
				dx[i] = d * a
			}
		}
	})
}

// GELU is the exact y = x·Φ(x) = 0.5·x·(1+erf(x/√2)), PyTorch's default
// (approximate="none"), with Φ and φ from normal (fastmath.go), kept for
// the backward pass.
type GELU struct{}

func (GELU) Kind() string                    { return "gelu" }
func (GELU) Params() []*Param                { return nil }
func (GELU) Build(in [][]int) ([]int, error) { return oneInput(in) }

func (GELU) Forward(c *Ctx, s *Slot, in []*Tensor) *Tensor {
	x, out := F32(in[0]), s.Buf(0, in[0].Shape()...)
	y, cdf, pdf := F32(out), F32(s.Buf(2, in[0].Shape()...)), F32(s.Buf(3, in[0].Shape()...))
	parallel(threadsOf(c), len(x), mathGrain, func(lo, hi int) {
		geluRange(x[lo:hi], y[lo:hi], cdf[lo:hi], pdf[lo:hi])
	})
	return out
}

// geluRange is GELU's y = x·Φ(x), Φ and φ of xs: the vector kernel's
// where it has one, else, and for the four values it leaves, normal's.
func geluRange(xs, ys, ps, ds []float32) {
	kernelThenLoop(len(xs), func(i int) int { return geluVector(xs[i:], ys[i:], ps[i:], ds[i:]) }, func(i int) {
		u := float64(xs[i])
		p, d := normal(u)
		ps[i], ds[i] = float32(p), float32(d)
		ys[i] = float32(u * p)
	})
}

// Backward is dy·(Φ(x) + x·φ(x)), Φ and φ as the forward pass kept them.
func (GELU) Backward(c *Ctx, s *Slot, in []*Tensor, out, dout *Tensor, need []bool) []*Tensor {
	g := s.Grads(1)
	if !need[0] {
		return g
	}
	dx := s.Buf(1, dout.Shape()...)
	x, cdf, pdf := F32(in[0]), F32(s.bufs[2]), F32(s.bufs[3])
	d := F32(dx)
	parallel(threadsOf(c), len(d), cheapGrain, func(lo, hi int) {
		xs, ps, qs, dys, ds := x[lo:hi], cdf[lo:hi], pdf[lo:hi], F32(dout)[lo:hi], d[lo:hi]
		for i, dy := range dys {
			ds[i] = dy * (ps[i] + float32(xs[i]*qs[i]))
		}
	})
	g[0] = dx
	return g
}

// Erf is y = erf(x) (ONNX Erf; exported GELUs decompose into it).
type Erf struct{}

func (Erf) Kind() string                    { return "erf" }
func (Erf) Params() []*Param                { return nil }
func (Erf) Build(in [][]int) ([]int, error) { return oneInput(in) }

func (Erf) Forward(c *Ctx, s *Slot, in []*Tensor) *Tensor {
	return unaryForward(c, s, in[0], mathGrain, func(y, x, _ []float32) {
		y = y[:len(x)]
		for i, v := range x {
			y[i] = float32(math.Erf(float64(v)))
		}
	})
}

// Backward is dy·2/√π·exp(-x²) from the saved input.
func (Erf) Backward(c *Ctx, s *Slot, in []*Tensor, out, dout *Tensor, need []bool) []*Tensor {
	return unaryBackward(c, s, dout, F32(in[0]), need, mathGrain, func(dx, dy, x []float32) {
		dx, x = dx[:len(dy)], x[:len(dy)]
		k := 2 / math.Sqrt(math.Pi)
		for i, d := range dy {
			u := float64(x[i])
			dx[i] = float32(float64(d) * k * expFast(-u*u))
		}
	})
}

// Softmax is y = exp(x)/Σexp(x) over the last per-sample dimension (each
// row on its own); it subtracts the row's maximum first, so no exp
// overflows, and sums in float64 in row order.
type Softmax struct{}

func (Softmax) Kind() string                    { return "softmax" }
func (Softmax) Params() []*Param                { return nil }
func (Softmax) Build(in [][]int) ([]int, error) { return rowInput(in) }

func (Softmax) Forward(c *Ctx, s *Slot, in []*Tensor) *Tensor {
	y := s.Buf(0, in[0].Shape()...)
	x, yd := F32(in[0]), F32(y)
	w := lastDim(in[0])
	eachRow(c, len(x)/w, w, func(r int) {
		xs, ys := x[r*w:(r+1)*w], yd[r*w:(r+1)*w]
		sum := expRow(xs, ys, rowMax(xs))
		// The float32 exponentials round twice in all: within 1 ulp.
		// Probabilities below float32's smallest normal number are 0: a
		// subnormal operand slows every product it meets tenfold (the
		// attention·values GEMM) for a change below 1.2e-38.
		normalizeRow(ys, 1/sum)
	})
	return y
}

// normalizeRow sets ys[i] = float32(p), p = float64(ys[i])·inv, or 0 where
// p is below float32's smallest normal number: the vector kernel's where
// it has one, else, and for the values it leaves, the loop's.
func normalizeRow(ys []float32, inv float64) {
	for i := normalizeVector(ys, inv); i < len(ys); i++ {
		p := float64(ys[i]) * inv
		if p < 0x1p-126 {
			p = 0
		}
		ys[i] = float32(p)
	}
}

// Backward is dx = y·(dy − Σ dy·y), the sum in float64 in row order.
func (Softmax) Backward(c *Ctx, s *Slot, in []*Tensor, out, dout *Tensor, need []bool) []*Tensor {
	g := s.Grads(1)
	if !need[0] {
		return g
	}
	dx := s.Buf(1, dout.Shape()...)
	y, dy, d := F32(out), F32(dout), F32(dx)
	w := lastDim(dout)
	eachRow(c, len(y)/w, w, func(r int) {
		ys, dys, ds := y[r*w:(r+1)*w], dy[r*w:(r+1)*w], d[r*w:(r+1)*w]
		var dot float64
		for i, v := range ys {
			dot += float64(float64(v) * float64(dys[i]))
		}
		for i, v := range ys {
			ds[i] = float32(float64(v) * (float64(dys[i]) - dot))
		}
	})
	g[0] = dx
	return g
}

// LogSoftmax is y = x − max − log Σexp(x − max) over the last per-sample
// dimension, in float64 and rounded once; it is stable where log(Softmax)
// underflows.
type LogSoftmax struct{}

func (LogSoftmax) Kind() string                    { return "logsoftmax" }
func (LogSoftmax) Params() []*Param                { return nil }
func (LogSoftmax) Build(in [][]int) ([]int, error) { return rowInput(in) }

func (LogSoftmax) Forward(c *Ctx, s *Slot, in []*Tensor) *Tensor {
	y := s.Buf(0, in[0].Shape()...)
	x, yd := F32(in[0]), F32(y)
	w := lastDim(in[0])
	eachRow(c, len(x)/w, w, func(r int) {
		xs, ys := x[r*w:(r+1)*w], yd[r*w:(r+1)*w]
		m := rowMax(xs)
		shift := m + logFast(expRow(xs, ys, m)) // ys holds the exponentials until overwritten
		for i, v := range xs {
			ys[i] = float32(float64(v) - shift)
		}
	})
	return y
}

// Backward is dx = dy − exp(y)·Σdy, the sum in float64 in row order.
func (LogSoftmax) Backward(c *Ctx, s *Slot, in []*Tensor, out, dout *Tensor, need []bool) []*Tensor {
	g := s.Grads(1)
	if !need[0] {
		return g
	}
	dx := s.Buf(1, dout.Shape()...)
	y, dy, d := F32(out), F32(dout), F32(dx)
	w := lastDim(dout)
	eachRow(c, len(y)/w, w, func(r int) {
		ys, dys, ds := y[r*w:(r+1)*w], dy[r*w:(r+1)*w], d[r*w:(r+1)*w]
		var sum float64
		for _, v := range dys {
			sum += float64(v)
		}
		for i, v := range ys {
			ds[i] = float32(float64(dys[i]) - float64(expFast(float64(v))*sum))
		}
	})
	g[0] = dx
	return g
}

// expRow sets ys[i] = float32(e), e = e^(xs[i] − m) by expFast, and
// returns the sum of the e's in row order: the vector kernel's where it
// has one, else, and for the four values it leaves, expFast's.
func expRow(xs, ys []float32, m float64) float64 {
	var sum float64
	kernelThenLoop(len(xs), func(i int) int { return expVector(xs[i:], ys[i:], m, &sum) }, func(i int) {
		e := expFast(float64(xs[i]) - m)
		ys[i] = float32(e)
		sum += e
	})
	return sum
}

// rowInput checks the one input of a layer that works on rows of the last
// dimension.
func rowInput(in [][]int) ([]int, error) {
	if len(in) != 1 {
		return nil, fmt.Errorf("takes one input, got %d", len(in))
	}
	if len(in[0]) == 0 || in[0][len(in[0])-1] < 1 {
		return nil, fmt.Errorf("input %v has no last dimension to work along", in[0])
	}
	return append([]int(nil), in[0]...), nil
}

// lastDim is the size of t's last dimension.
func lastDim(t *Tensor) int {
	sh := t.Shape()
	return sh[len(sh)-1]
}

// eachRow runs fn on rows [0, rows) of width w, in parallel chunks of whole
// rows, so a reduction over a row never splits.
func eachRow(c *Ctx, rows, w int, fn func(r int)) {
	parallel(threadsOf(c), rows, max(1, mathGrain/w), func(lo, hi int) {
		for r := lo; r < hi; r++ {
			fn(r)
		}
	})
}

// rowMax is the largest element of a non-empty row, as float64.
func rowMax(xs []float32) float64 {
	m := xs[0]
	for _, v := range xs[1:] {
		m = max(m, v)
	}
	return float64(m)
}
