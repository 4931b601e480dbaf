package nn

import (
	"fmt"
	"math"
)

// Binary is an elementwise y = a Op b of two inputs of the same shape, Op
// "sub", "mul" or "div" (sums are [Add]). Each is one float32 operation, as
// in PyTorch.
type Binary struct{ Op string }

func (l Binary) Kind() string   { return l.Op }
func (Binary) Params() []*Param { return nil }

func (l Binary) Build(in [][]int) ([]int, error) {
	switch l.Op {
	case "sub", "mul", "div":
	default:
		return nil, fmt.Errorf("unknown binary operation %q (want sub, mul or div)", l.Op)
	}
	if len(in) != 2 {
		return nil, fmt.Errorf("takes two inputs, got %d", len(in))
	}
	if !SameShape(in[0], in[1]) {
		return nil, fmt.Errorf("input shapes %v and %v differ", in[0], in[1])
	}
	return append([]int(nil), in[0]...), nil
}

func (l Binary) Forward(c *Ctx, s *Slot, in []*Tensor) *Tensor {
	y := s.Buf(0, in[0].Shape()...)
	var f func(y, a, b []float32)
	switch l.Op {
	case "sub":
		f = subTo
	case "mul":
		f = mulTo
	case "div":
		f = divTo
	}
	zipChunks(c, cheapGrain, F32(y), F32(in[0]), F32(in[1]), f)
	return y
}

func subTo(y, a, b []float32) {
	y, b = y[:len(a)], b[:len(a)]
	for i, v := range a {
		y[i] = v - b[i]
	}
}

func mulTo(y, a, b []float32) {
	y, b = y[:len(a)], b[:len(a)]
	for i, v := range a {
		y[i] = v * b[i]
	}
}

func divTo(y, a, b []float32) {
	y, b = y[:len(a)], b[:len(a)]
	for i, v := range a {
		y[i] = v / b[i]
	}
}

// Backward returns, for sub, dout itself and -dout; for mul, dout·b and
// dout·a; for div, dout/b and -dout·a/b² (in float64).
func (l Binary) Backward(c *Ctx, s *Slot, in []*Tensor, out, dout *Tensor, need []bool) []*Tensor {
	g := s.Grads(2)
	a, b, dy := F32(in[0]), F32(in[1]), F32(dout)
	grad := func(k int, src []float32, f func(dx, dy, src []float32)) {
		if !need[k] {
			return
		}
		dx := s.Buf(1+k, dout.Shape()...)
		zipChunks(c, cheapGrain, F32(dx), dy, src, f)
		g[k] = dx
	}
	switch l.Op {
	case "sub":
		if need[0] {
			g[0] = dout
		}
		grad(1, nil, negTo)
	case "mul":
		grad(0, b, mulTo)
		grad(1, a, mulTo)
	case "div":
		grad(0, b, divTo)
		if need[1] {
			db := s.Buf(2, dout.Shape()...)
			d := F32(db)
			parallel(threadsOf(c), len(d), cheapGrain, func(lo, hi int) {
				ds, dys, as, bs := d[lo:hi], dy[lo:hi], a[lo:hi], b[lo:hi]
				for i, v := range dys {
					q := float64(bs[i])
					ds[i] = float32(-float64(v) * float64(as[i]) / (q * q))
				}
			})
			g[1] = db
		}
	}
	return g
}

func negTo(y, x, _ []float32) {
	y = y[:len(x)]
	for i, v := range x {
		y[i] = -v
	}
}

// Scalar is an elementwise operation of its input x and the constant C, Op
// one of "add" (x+C), "sub" (x-C), "rsub" (C-x), "mul" (x·C), "div" (x/C),
// "rdiv" (C/x), "pow" (x^C), "mod" (the remainder with C's sign, Python's
// %) or "fmod" (with x's sign). Each but pow is one exact float32
// operation, as in PyTorch; pow is computed in float64 and rounded once.
type Scalar struct {
	Op string
	C  float32
}

func (Scalar) Kind() string     { return "scalar" }
func (Scalar) Params() []*Param { return nil }

func (l Scalar) Build(in [][]int) ([]int, error) {
	switch l.Op {
	case "add", "sub", "rsub", "mul", "div", "rdiv", "pow", "mod", "fmod":
	default:
		return nil, fmt.Errorf("unknown scalar operation %q (want add, sub, rsub, mul, div, rdiv, pow, mod or fmod)", l.Op)
	}
	return oneInput(in)
}

func (l Scalar) Forward(c *Ctx, s *Slot, in []*Tensor) *Tensor {
	k := l.C
	var f func(y, x, _ []float32)
	switch l.Op {
	case "add":
		f = func(y, x, _ []float32) {
			y = y[:len(x)]
			for i, v := range x {
				y[i] = v + k
			}
		}
	case "sub":
		f = func(y, x, _ []float32) {
			y = y[:len(x)]
			for i, v := range x {
				y[i] = v - k
			}
		}
	case "rsub":
		f = func(y, x, _ []float32) {
			y = y[:len(x)]
			for i, v := range x {
				y[i] = k - v
			}
		}
	case "mul":
		f = func(y, x, _ []float32) {
			y = y[:len(x)]
			for i, v := range x {
				y[i] = v * k
			}
		}
	case "div":
		f = func(y, x, _ []float32) {
			y = y[:len(x)]
			for i, v := range x {
				y[i] = v / k
			}
		}
	case "rdiv":
		f = func(y, x, _ []float32) {
			y = y[:len(x)]
			for i, v := range x {
				y[i] = k / v
			}
		}
	case "pow":
		e := float64(k)
		f = func(y, x, _ []float32) {
			y = y[:len(x)]
			for i, v := range x {
				y[i] = float32(math.Pow(float64(v), e))
			}
		}
	case "mod", "fmod":
		floor := l.Op == "mod"
		f = func(y, x, _ []float32) {
			y = y[:len(x)]
			for i, v := range x {
				r := float32(math.Mod(float64(v), float64(k)))
				if floor && r != 0 && (r < 0) != (k < 0) {
					r += k
				}
				y[i] = r
			}
		}
	}
	return unaryForward(c, s, in[0], cheapGrain, f)
}

// Backward is dout for add, sub, mod and fmod, -dout for rsub, dout·C for mul, dout/C
// for div, -dout·C/x² for rdiv and dout·C·x^(C-1) for pow (0 when C = 0).
func (l Scalar) Backward(c *Ctx, s *Slot, in []*Tensor, out, dout *Tensor, need []bool) []*Tensor {
	k := l.C
	var f func(dx, dy, x []float32)
	switch l.Op {
	case "add", "sub", "mod", "fmod":
		g := s.Grads(1)
		if need[0] {
			g[0] = dout
		}
		return g
	case "rsub":
		f = negTo
	case "mul":
		f = func(dx, dy, _ []float32) {
			dx = dx[:len(dy)]
			for i, v := range dy {
				dx[i] = v * k
			}
		}
	case "div":
		f = func(dx, dy, _ []float32) {
			dx = dx[:len(dy)]
			for i, v := range dy {
				dx[i] = v / k
			}
		}
	case "rdiv":
		f = func(dx, dy, x []float32) {
			dx, x = dx[:len(dy)], x[:len(dy)]
			for i, v := range dy {
				u := float64(x[i])
				dx[i] = float32(-float64(v) * float64(k) / (u * u))
			}
		}
	case "pow":
		e := float64(k)
		f = func(dx, dy, x []float32) {
			dx, x = dx[:len(dy)], x[:len(dy)]
			for i, v := range dy {
				if e == 0 {
					dx[i] = 0
					continue
				}
				dx[i] = float32(float64(v) * e * math.Pow(float64(x[i]), e-1))
			}
		}
	}
	return unaryBackward(c, s, dout, F32(in[0]), need, cheapGrain, f)
}

// columnChunks runs a column reduction over a rows×cols matrix in parallel
// chunks of whole columns: every column is summed by one goroutine in row
// order, so the bits do not depend on the thread count.
func columnChunks(c *Ctx, rows, cols int, fn func(lo, hi int)) {
	parallel(threadsOf(c), cols, max(16, cheapGrain/max(rows, 1)), fn)
}
