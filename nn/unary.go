package nn

import (
	"fmt"
	"math"
)

// Clip is y = min(max(x, Min), Max): ONNX's Clip, PyTorch's clamp and
// hardtanh (ReLU6 is Clip{0, 6}). A missing bound is ±Inf. NaN passes
// through.
//
// The backward pass is PyTorch's hardtanh's, which nn.ReLU6 uses: dx = dy
// where Min < x < Max strictly, else 0 (clamp's own backward also passes
// x equal to a bound).
type Clip struct{ Min, Max float32 }

func (Clip) Kind() string     { return "clip" }
func (Clip) Params() []*Param { return nil }
func (l Clip) Build(in [][]int) ([]int, error) {
	if l.Min != l.Min || l.Max != l.Max {
		return nil, fmt.Errorf("NaN bound [%v, %v]", l.Min, l.Max)
	}
	return oneInput(in)
}

func (l Clip) Forward(c *Ctx, s *Slot, in []*Tensor) *Tensor {
	lo, hi := l.Min, l.Max
	return unaryForward(c, s, in[0], cheapGrain, func(y, x, _ []float32) {
		y = y[:len(x)]
		for i, v := range x {
			y[i] = min(max(v, lo), hi)
		}
	})
}

func (l Clip) Backward(c *Ctx, s *Slot, in []*Tensor, out, dout *Tensor, need []bool) []*Tensor {
	lo, hi := l.Min, l.Max
	return unaryBackward(c, s, dout, F32(in[0]), need, cheapGrain, func(dx, dy, x []float32) {
		dx, x = dx[:len(dy)], x[:len(dy)]
		for i, d := range dy {
			if x[i] <= lo || x[i] >= hi {
				d = 0
			}
			dx[i] = d
		}
	})
}

// HardSigmoid is y = max(0, min(1, Alpha·x + Beta)), ONNX's HardSigmoid
// (PyTorch's hardsigmoid is Alpha 1/6, Beta 1/2), in float64 and rounded
// once. The backward pass is dx = Alpha·dy where 0 < Alpha·x + Beta < 1
// strictly, else 0, as PyTorch's (-3 < x < 3).
type HardSigmoid struct{ Alpha, Beta float32 }

func (HardSigmoid) Kind() string     { return "hardsigmoid" }
func (HardSigmoid) Params() []*Param { return nil }
func (l HardSigmoid) Build(in [][]int) ([]int, error) {
	if l.Alpha != l.Alpha || l.Beta != l.Beta {
		return nil, fmt.Errorf("NaN alpha or beta (%v, %v)", l.Alpha, l.Beta)
	}
	return oneInput(in)
}

func (l HardSigmoid) Forward(c *Ctx, s *Slot, in []*Tensor) *Tensor {
	a, b := float64(l.Alpha), float64(l.Beta)
	return unaryForward(c, s, in[0], cheapGrain, mapF64(func(u float64) float64 { return max(0, min(1, a*u+b)) }))
}

func (l HardSigmoid) Backward(c *Ctx, s *Slot, in []*Tensor, out, dout *Tensor, need []bool) []*Tensor {
	a, b := float64(l.Alpha), float64(l.Beta)
	return unaryBackward(c, s, dout, F32(in[0]), need, cheapGrain, gradF64(func(u float64) float64 {
		if v := a*u + b; v > 0 && v < 1 {
			return a
		}
		return 0
	}))
}

// ELU is ONNX's Elu, Selu and Celu: y = Gamma·x for x > 0, else
// Gamma·Alpha·(exp(x/Alpha) − 1) with Celu, else Gamma·Alpha·(exp(x) − 1)
// (PyTorch's elu, selu and celu; Gamma is 1 but for selu), in float64 and
// rounded once, the backward pass from the saved input; the exponentials
// are fastmath.go's, the same bits on every architecture.
type ELU struct {
	Alpha, Gamma float32
	Celu         bool
}

func (ELU) Kind() string     { return "elu" }
func (ELU) Params() []*Param { return nil }
func (l ELU) Build(in [][]int) ([]int, error) {
	if !(l.Alpha > 0) || !(l.Gamma > 0) || math.IsInf(float64(l.Alpha), 0) || math.IsInf(float64(l.Gamma), 0) {
		return nil, fmt.Errorf("alpha %v and gamma %v must be positive", l.Alpha, l.Gamma)
	}
	return oneInput(in)
}

// scales returns Gamma, Alpha and the exponent's factor, in float64.
func (l ELU) scales() (g, a, k float64) {
	g, a, k = float64(l.Gamma), float64(l.Alpha), 1
	if l.Celu {
		k = 1 / a
	}
	return
}

func (l ELU) Forward(c *Ctx, s *Slot, in []*Tensor) *Tensor {
	g, a, k := l.scales()
	return unaryForward(c, s, in[0], mathGrain, mapF64(func(u float64) float64 {
		if u > 0 {
			return g * u
		}
		return g * a * expm1Fast(k*u)
	}))
}

func (l ELU) Backward(c *Ctx, s *Slot, in []*Tensor, out, dout *Tensor, need []bool) []*Tensor {
	g, a, k := l.scales()
	return unaryBackward(c, s, dout, F32(in[0]), need, mathGrain, gradF64(func(u float64) float64 {
		if u > 0 {
			return g
		}
		return g * a * k * expFast(k*u)
	}))
}

// HardSwish is y = x·min(max(x + 3, 0), 6)/6, PyTorch's hardswish (ONNX's
// HardSwish; opset 13 exports it as x·HardSigmoid(x)), in float64 and
// rounded once. Its backward pass is PyTorch's (its vectorised kernel):
// 0 below -3, dy from 3 on, dy·(x/3 + 1/2) between.
type HardSwish struct{}

func (HardSwish) Kind() string                    { return "hardswish" }
func (HardSwish) Params() []*Param                { return nil }
func (HardSwish) Build(in [][]int) ([]int, error) { return oneInput(in) }

func (HardSwish) Forward(c *Ctx, s *Slot, in []*Tensor) *Tensor {
	return unaryForward(c, s, in[0], cheapGrain, mapF64(func(u float64) float64 { return u * min(max(u+3, 0), 6) / 6 }))
}

func (HardSwish) Backward(c *Ctx, s *Slot, in []*Tensor, out, dout *Tensor, need []bool) []*Tensor {
	return unaryBackward(c, s, dout, F32(in[0]), need, cheapGrain, gradF64(func(u float64) float64 {
		switch {
		case u < -3:
			return 0
		case u < 3:
			return u/3 + 0.5
		}
		return 1
	}))
}

// Unary is an elementwise function of one input, named by Op (which is also
// its Kind):
//
//	sqrt, exp, log, neg, abs, reciprocal, sin, cos,
//	softplus     log(1+exp(x)), computed without overflow,
//	silu         x·sigmoid(x),
//	sign         -1, 0 or 1 (NaN for NaN), whose gradient is 0.
//
// Each is computed in float64 and rounded once, forward and backward; the
// backward passes use the saved input. At the points where a function has
// no derivative, abs takes 0 (PyTorch's sgn).
type Unary struct{ Op string }

// unaryOp is an operation's forward and backward loops and their grain.
type unaryOp struct {
	f, df func(y, x, a []float32)
	grain int
}

var unaryOps = map[string]unaryOp{
	"sqrt": {
		mapF64(math.Sqrt),
		gradF64(func(u float64) float64 { return 0.5 / math.Sqrt(u) }),
		mathGrain},
	"exp": {mapF64(expFast), gradF64(expFast), mathGrain},
	"log": {
		mapF64(math.Log),
		gradF64(func(u float64) float64 { return 1 / u }),
		mathGrain},
	"neg": {negTo, negTo, cheapGrain},
	"abs": {
		func(y, x, _ []float32) {
			y = y[:len(x)]
			for i, v := range x {
				y[i] = float32(math.Abs(float64(v)))
			}
		},
		func(dx, dy, x []float32) {
			dx, x = dx[:len(dy)], x[:len(dy)]
			for i, d := range dy {
				switch {
				case x[i] > 0:
					dx[i] = d
				case x[i] < 0:
					dx[i] = -d
				default:
					dx[i] = 0
				}
			}
		},
		cheapGrain},
	"sign": {
		mapF64(func(u float64) float64 {
			switch {
			case u > 0:
				return 1
			case u < 0:
				return -1
			}
			return u // 0, -0 or NaN
		}),
		func(dx, dy, _ []float32) { clear(dx[:len(dy)]) },
		cheapGrain},
	"reciprocal": {
		mapF64(func(u float64) float64 { return 1 / u }),
		gradF64(func(u float64) float64 { return -1 / float64(u*u) }),
		cheapGrain},
	"sin": {mapF64(math.Sin), gradF64(math.Cos), mathGrain},
	"cos": {
		mapF64(math.Cos),
		gradF64(func(u float64) float64 { return -math.Sin(u) }),
		mathGrain},
	"softplus": {
		mapF64(func(u float64) float64 {
			if u > 0 {
				return u + math.Log1p(expFast(-u))
			}
			return math.Log1p(expFast(u))
		}),
		gradF64(sigmoidFast),
		mathGrain},
	"silu": {
		mapF64(func(u float64) float64 { return u / (1 + expFast(-u)) }),
		gradF64(func(u float64) float64 {
			s := sigmoidFast(u)
			return s * (1 + float64(u*(1-s)))
		}),
		mathGrain},
}

// mapF64 is the forward loop y = f(x), f in float64, rounded once.
func mapF64(f func(float64) float64) func(y, x, _ []float32) {
	return func(y, x, _ []float32) {
		y = y[:len(x)]
		for i, v := range x {
			y[i] = float32(f(float64(v)))
		}
	}
}

// gradF64 is the backward loop dx = dy·f'(x), in float64, rounded once.
func gradF64(df func(float64) float64) func(dx, dy, x []float32) {
	return func(dx, dy, x []float32) {
		dx, x = dx[:len(dy)], x[:len(dy)]
		for i, d := range dy {
			dx[i] = float32(float64(d) * df(float64(x[i])))
		}
	}
}

func (l Unary) Kind() string   { return l.Op }
func (Unary) Params() []*Param { return nil }

func (l Unary) Build(in [][]int) ([]int, error) {
	if _, ok := unaryOps[l.Op]; !ok {
		return nil, fmt.Errorf("unknown unary operation %q (want sqrt, exp, log, neg, abs, reciprocal, sin, cos, softplus, silu or sign)", l.Op)
	}
	return oneInput(in)
}

func (l Unary) Forward(c *Ctx, s *Slot, in []*Tensor) *Tensor {
	op := unaryOps[l.Op]
	return unaryForward(c, s, in[0], op.grain, op.f)
}

func (l Unary) Backward(c *Ctx, s *Slot, in []*Tensor, out, dout *Tensor, need []bool) []*Tensor {
	op := unaryOps[l.Op]
	return unaryBackward(c, s, dout, F32(in[0]), need, op.grain, op.df)
}
