package nn

import (
	"fmt"
	"math"
)

// Optimizer updates trainable parameters from their gradients and zeroes the
// gradients. Its state is per parameter, so a stage's optimizer holds state
// for the stage's parameters only, and a whole-model optimizer's state splits
// by parameter name.
type Optimizer interface {
	// Step applies one update to every trainable parameter in ps and zeroes
	// their gradients.
	Step(ps []*Param)
	// State returns the optimizer's tensors for p by name suffix (for
	// checkpoints), creating them if needed.
	State(p *Param) map[string]*Tensor
	// Steps is the number of updates applied so far.
	Steps() int
	// SetSteps restores the update count from a checkpoint.
	SetSteps(n int)
	// SetLR sets the learning rate of the following steps (see Schedule).
	SetLR(lr float64)
}

// OptimizerConfig selects and configures an optimizer.
type OptimizerConfig struct {
	Name        string // "sgd" or "adam"
	LR          float64
	Momentum    float64 // sgd
	WeightDecay float64
	Beta1       float64 // adam; 0 means 0.9
	Beta2       float64 // adam; 0 means 0.999
	Eps         float64 // adam; 0 means 1e-8
	// Threads bounds the goroutines of an update (elementwise, so the bits
	// do not depend on it); 0 means 1.
	Threads int
}

// NewOptimizer returns the configured optimizer.
func NewOptimizer(c OptimizerConfig) (Optimizer, error) {
	if c.LR <= 0 || math.IsNaN(c.LR) || math.IsInf(c.LR, 0) {
		return nil, fmt.Errorf("nn: learning rate %v must be positive", c.LR)
	}
	switch c.Name {
	case "sgd", "":
		return &SGD{LR: c.LR, Momentum: c.Momentum, WeightDecay: c.WeightDecay, threads: max(c.Threads, 1), state: map[*Param]*Tensor{}}, nil
	case "adam":
		a := &Adam{LR: c.LR, Beta1: c.Beta1, Beta2: c.Beta2, Eps: c.Eps, WeightDecay: c.WeightDecay, threads: max(c.Threads, 1), state: map[*Param][2]*Tensor{}}
		if a.Beta1 == 0 {
			a.Beta1 = 0.9
		}
		if a.Beta2 == 0 {
			a.Beta2 = 0.999
		}
		if a.Eps == 0 {
			a.Eps = 1e-8
		}
		return a, nil
	}
	return nil, fmt.Errorf("nn: unknown optimizer %q (want sgd or adam)", c.Name)
}

// SGD is stochastic gradient descent with momentum and weight decay, as
// PyTorch's torch.optim.SGD (dampening 0, no Nesterov):
// g += wd·w; buf = g on the first step, else buf = μ·buf + g; w -= lr·buf.
type SGD struct {
	LR, Momentum, WeightDecay float64
	steps, threads            int
	state                     map[*Param]*Tensor
}

func (o *SGD) Steps() int       { return o.steps }
func (o *SGD) SetLR(lr float64) { o.LR = lr }
func (o *SGD) SetSteps(n int)   { o.steps = n }

func (o *SGD) State(p *Param) map[string]*Tensor {
	if o.Momentum == 0 {
		return nil
	}
	return map[string]*Tensor{"momentum_buffer": o.buf(p)}
}

func (o *SGD) buf(p *Param) *Tensor {
	b, ok := o.state[p]
	if !ok {
		b = New(p.Value.Shape()...)
		o.state[p] = b
	}
	return b
}

func (o *SGD) Step(ps []*Param) {
	lr, mu, wd := float32(o.LR), float32(o.Momentum), float32(o.WeightDecay)
	first := o.steps == 0
	for _, p := range ps {
		if !p.Trainable() {
			continue
		}
		w, g := F32(p.Value), F32(p.Grad)
		var b []float32
		if mu != 0 {
			b = F32(o.buf(p))
		}
		parallel(o.threads, len(w), 1<<15, func(lo, hi int) {
			sgdUpdate(w[lo:hi], g[lo:hi], sub(b, lo, hi), lr, mu, wd, first)
		})
	}
	o.steps++
}

func sub(b []float32, lo, hi int) []float32 {
	if b == nil {
		return nil
	}
	return b[lo:hi]
}

// sgdUpdate is one SGD step on a chunk, with the common case (momentum, no
// weight decay, not the first step) as a tight loop free of branches and
// bounds checks.
func sgdUpdate(w, g, b []float32, lr, mu, wd float32, first bool) {
	g = g[:len(w)]
	if b != nil && wd == 0 && !first {
		b = b[:len(w)]
		for i := range w {
			v := mu*b[i] + g[i]
			b[i] = v
			w[i] -= lr * v
			g[i] = 0
		}
		return
	}
	for i := range w {
		d := g[i]
		if wd != 0 {
			d += wd * w[i]
		}
		if b != nil {
			if first {
				b[i] = d
			} else {
				b[i] = mu*b[i] + d
			}
			d = b[i]
		}
		w[i] -= lr * d
		g[i] = 0
	}
}

// Adam is torch.optim.Adam (L2 weight decay added to the gradient, no
// AMSGrad), with PyTorch's order of operations.
type Adam struct {
	LR, Beta1, Beta2, Eps, WeightDecay float64
	steps, threads                     int
	state                              map[*Param][2]*Tensor
}

func (o *Adam) Steps() int       { return o.steps }
func (o *Adam) SetLR(lr float64) { o.LR = lr }
func (o *Adam) SetSteps(n int)   { o.steps = n }

func (o *Adam) moments(p *Param) [2]*Tensor {
	m, ok := o.state[p]
	if !ok {
		m = [2]*Tensor{New(p.Value.Shape()...), New(p.Value.Shape()...)}
		o.state[p] = m
	}
	return m
}

func (o *Adam) State(p *Param) map[string]*Tensor {
	m := o.moments(p)
	return map[string]*Tensor{"exp_avg": m[0], "exp_avg_sq": m[1]}
}

func (o *Adam) Step(ps []*Param) {
	o.steps++
	t := float64(o.steps)
	bc1 := 1 - math.Pow(o.Beta1, t)
	bc2 := 1 - math.Pow(o.Beta2, t)
	stepSize := float32(o.LR / bc1)
	bc2s := float32(math.Sqrt(bc2))
	b1, b2 := float32(o.Beta1), float32(o.Beta2)
	eps, wd := float32(o.Eps), float32(o.WeightDecay)
	for _, p := range ps {
		if !p.Trainable() {
			continue
		}
		mo := o.moments(p)
		w, g, m, v := F32(p.Value), F32(p.Grad), F32(mo[0]), F32(mo[1])
		parallel(o.threads, len(w), 1<<15, func(lo, hi int) {
			for i := lo; i < hi; i++ {
				d := g[i]
				if wd != 0 {
					d += wd * w[i]
				}
				m[i] = m[i]*b1 + (1-b1)*d
				v[i] = v[i]*b2 + (1-b2)*d*d
				denom := float32(math.Sqrt(float64(v[i])))/bc2s + eps
				w[i] -= stepSize * (m[i] / denom)
				g[i] = 0
			}
		})
	}
}
