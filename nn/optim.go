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
	Name        string // "sgd", "adam" or "adamw"
	LR          float64
	Momentum    float64 // sgd
	WeightDecay float64
	// NoDecay1D leaves one-dimensional tensors (biases, normalisation
	// scales) out of the weight decay, as nanoGPT's and Hugging Face's
	// recipes do (PyTorch's parameter groups split by p.dim() >= 2).
	NoDecay1D bool
	Beta1     float64 // adam; 0 means 0.9
	Beta2     float64 // adam; 0 means 0.999
	Eps       float64 // adam; 0 means 1e-8
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
		return &SGD{LR: c.LR, Momentum: c.Momentum, WeightDecay: c.WeightDecay, NoDecay1D: c.NoDecay1D,
			threads: max(c.Threads, 1), state: map[*Param]*Tensor{}}, nil
	case "adam", "adamw":
		a := &Adam{LR: c.LR, Beta1: c.Beta1, Beta2: c.Beta2, Eps: c.Eps, WeightDecay: c.WeightDecay, NoDecay1D: c.NoDecay1D,
			Decoupled: c.Name == "adamw", threads: max(c.Threads, 1), state: map[*Param][2]*Tensor{}}
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
	return nil, fmt.Errorf("nn: unknown optimizer %q (want sgd, adam or adamw)", c.Name)
}

// IsAdam reports whether the optimizer of that name is Adam's, with two
// moments a parameter: adam or adamw.
func IsAdam(name string) bool { return name == "adam" || name == "adamw" }

// # How a step runs
//
// A step is one fused pass: every element of every trainable parameter is
// read (gradient, value, state), updated and written back (state, value, a
// zeroed gradient) in a single loop, so each array crosses the memory bus
// once per step. The parameters are laid end to end as one index space (a
// [pass]) that [parallel] splits among the threads: one hand-off to the
// workers per step however many parameters there are, and small tensors
// (biases) share the threads with large ones. The update is elementwise, so
// where the split falls does not change a bit.
//
// The loops run in float32 with every product rounded before it is added
// (float32(x*y) + z), which stops the compiler from fusing them into
// multiply-adds (it does on arm64, and on amd64 from GOAMD64=v3): the bits
// are the same on every machine. On amd64 with AVX2 the bulk of each
// parameter runs in assembly (optim_amd64.s), eight lanes at a time with the
// same operations in the same order (separate VMULPS and VADDPS, VSQRTPS,
// VDIVPS); the Go loops take the tails and the other architectures. The
// square root is the correctly rounded float32 one everywhere:
// float32(math.Sqrt(float64(v))) rounds twice, which is exact for a float32
// root (53 >= 2·24+2 bits).
//
// The scalars (lr, μ, wd, β, ε, lr/(1−β1^t), √(1−β2^t)) are rounded to
// float32 once per step, as PyTorch's CPU kernels use them on float32
// tensors, and the operations are PyTorch's in its order. One difference
// is kept from before, so that the bits did not change: 1−β is formed in
// float32 from float32(β), where PyTorch rounds 1−β computed in float64
// (0.100000024 rather than 0.1 for β1 = 0.9).

// pass lays the trainable parameters of a step end to end.
type pass struct {
	params []passParam
	n      int
}

// passParam is one parameter's place in a pass, with the arrays its update
// reads and writes.
type passParam struct {
	start, end int
	w, g       []float32 // value and gradient
	a, b       []float32 // optimizer state (nil if unused)
	keep       bool      // left out of the weight decay
}

func (p *pass) reset() {
	clear(p.params) // drop references to the previous step's tensors
	p.params, p.n = p.params[:0], 0
}

// add appends a parameter. State arrays must be as long as w (or nil);
// keep leaves it out of the weight decay.
func (p *pass) add(w, g, a, b []float32, keep bool) {
	g = g[:len(w)]
	if a != nil {
		a = a[:len(w)]
	}
	if b != nil {
		b = b[:len(w)]
	}
	p.params = append(p.params, passParam{start: p.n, end: p.n + len(w), w: w, g: g, a: a, b: b, keep: keep})
	p.n += len(w)
}

// find returns the index of the parameter that holds element i.
func (p *pass) find(i int) int {
	lo, hi := 0, len(p.params)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if p.params[m].end <= i {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo
}

// decays reports whether a step with weight decay decays p: every
// trainable tensor, or with noDecay1D those of two or more axes.
func decays(p *Param, noDecay1D bool) bool { return !noDecay1D || len(p.Value.Shape()) >= 2 }

// optimGrain is the fewest elements worth a thread of an update.
const optimGrain = 1 << 15

// SGD is stochastic gradient descent with momentum and weight decay, as
// PyTorch's torch.optim.SGD (dampening 0, no Nesterov):
// g += wd·w; buf = g on the first step, else buf = μ·buf + g; w -= lr·buf.
type SGD struct {
	LR, Momentum, WeightDecay float64
	NoDecay1D                 bool // see [OptimizerConfig]
	steps, threads            int
	state                     map[*Param]*Tensor

	pass  pass
	k     sgdCoef
	kKeep sgdCoef          // k without the decay, for the tensors it leaves out
	run   func(lo, hi int) // o.chunk, made once so that a step allocates nothing
}

// sgdCoef is an SGD step's coefficients, in the layout sgdAVX2 reads
// (optim_amd64.s): lr, mu, wd at 0, 4, 8; the flags at 12, 13, 14.
type sgdCoef struct {
	lr, mu, wd float32
	// decay is wd != 0: like PyTorch, weight decay is skipped when zero
	// rather than adding 0·w (which is not +0 for w = -0, ±Inf or NaN).
	decay    bool
	momentum bool // mu != 0: the update goes through the momentum buffer
	first    bool // the first step: buf = g
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
	o.k = sgdCoef{lr: lr, mu: mu, wd: wd, decay: wd != 0, momentum: mu != 0, first: o.steps == 0}
	o.kKeep = o.k
	o.kKeep.decay = false
	o.pass.reset()
	for _, p := range ps {
		if !p.Trainable() {
			continue
		}
		var b []float32
		if o.k.momentum {
			b = F32(o.buf(p))
		}
		o.pass.add(F32(p.Value), F32(p.Grad), b, nil, !decays(p, o.NoDecay1D))
	}
	if o.run == nil {
		o.run = o.chunk
	}
	parallel(o.threads, o.pass.n, optimGrain, o.run)
	o.pass.reset()
	o.steps++
}

// chunk updates elements [lo, hi) of the pass.
func (o *SGD) chunk(lo, hi int) {
	for k := o.pass.find(lo); lo < hi; k++ {
		s := &o.pass.params[k]
		i, j := lo-s.start, min(hi, s.end)-s.start
		k := &o.k
		if s.keep {
			k = &o.kKeep
		}
		sgdUpdate(s.w[i:j], s.g[i:j], sub(s.a, i, j), k)
		lo = s.end
	}
}

func sub(b []float32, lo, hi int) []float32 {
	if b == nil {
		return nil
	}
	return b[lo:hi]
}

// sgdUpdate is one SGD step on a piece of a parameter (b is nil without
// momentum): the vector kernel takes what it can, the loops the rest.
func sgdUpdate(w, g, b []float32, k *sgdCoef) {
	g = g[:len(w)]
	if b != nil {
		b = b[:len(w)]
	}
	n := 0
	if !k.first {
		n = sgdVector(w, g, b, k)
	}
	w, g = w[n:], g[n:]
	lr, mu, wd := k.lr, k.mu, k.wd
	switch {
	case k.momentum && !k.decay && !k.first:
		b = b[n : len(w)+n]
		for i := range w {
			v := float32(mu*b[i]) + g[i]
			b[i] = v
			w[i] -= float32(lr * v)
			g[i] = 0
		}
	case k.momentum:
		b = b[n : len(w)+n]
		for i := range w {
			d := g[i]
			if k.decay {
				d += float32(wd * w[i])
			}
			if !k.first {
				d = float32(mu*b[i]) + d
			}
			b[i] = d
			w[i] -= float32(lr * d)
			g[i] = 0
		}
	default:
		for i := range w {
			d := g[i]
			if k.decay {
				d += float32(wd * w[i])
			}
			w[i] -= float32(lr * d)
			g[i] = 0
		}
	}
}

// Adam is torch.optim.Adam (L2 weight decay added to the gradient, no
// AMSGrad), with PyTorch's order of operations:
// g += wd·w; m = β1·m + (1−β1)·g; v = β2·v + (1−β2)·g·g;
// w -= lr/(1−β1^t) · m / (√v/√(1−β2^t) + ε).
type Adam struct {
	LR, Beta1, Beta2, Eps, WeightDecay float64
	// Decoupled makes it AdamW: the weights shrink by 1 − lr·decay before
	// the step instead of the decay joining the gradient (PyTorch's AdamW).
	Decoupled      bool
	NoDecay1D      bool // see [OptimizerConfig]
	steps, threads int
	state          map[*Param][2]*Tensor

	pass   pass
	k      adamCoef
	kKeep  adamCoef         // k without the decay, for the tensors it leaves out
	shrink float32          // AdamW's factor of the weights before a step (1: none)
	run    func(lo, hi int) // o.chunk, made once so that a step allocates nothing
}

// adamCoef is an Adam step's coefficients, in the layout adamAVX2 reads
// (optim_amd64.s): eight float32 at 0, 4, ..., 28, then the flag at 32.
type adamCoef struct {
	b1, c1   float32 // β1, 1−β1
	b2, c2   float32 // β2, 1−β2
	bc2s     float32 // √(1−β2^t)
	eps      float32
	stepSize float32 // lr/(1−β1^t)
	wd       float32
	decay    bool // wd != 0
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
	b1, b2 := float32(o.Beta1), float32(o.Beta2)
	wd := float32(o.WeightDecay)
	o.k = adamCoef{
		b1: b1, c1: 1 - b1, b2: b2, c2: 1 - b2,
		bc2s: float32(math.Sqrt(bc2)), eps: float32(o.Eps), stepSize: float32(o.LR / bc1),
		wd: wd, decay: wd != 0 && !o.Decoupled,
	}
	o.kKeep = o.k
	o.kKeep.decay = false
	o.shrink = 1
	if o.Decoupled && wd != 0 {
		o.shrink = float32(1 - o.LR*o.WeightDecay)
	}
	o.pass.reset()
	for _, p := range ps {
		if !p.Trainable() {
			continue
		}
		mo := o.moments(p)
		o.pass.add(F32(p.Value), F32(p.Grad), F32(mo[0]), F32(mo[1]), !decays(p, o.NoDecay1D))
	}
	if o.run == nil {
		o.run = o.chunk
	}
	parallel(o.threads, o.pass.n, optimGrain, o.run)
	o.pass.reset()
}

// chunk updates elements [lo, hi) of the pass.
func (o *Adam) chunk(lo, hi int) {
	for k := o.pass.find(lo); lo < hi; k++ {
		s := &o.pass.params[k]
		i, j := lo-s.start, min(hi, s.end)-s.start
		k := &o.k
		if s.keep {
			k = &o.kKeep
		} else if o.shrink != 1 {
			w := s.w[i:j]
			for x := range w {
				w[x] *= o.shrink
			}
		}
		adamUpdate(s.w[i:j], s.g[i:j], s.a[i:j], s.b[i:j], k)
		lo = s.end
	}
}

// adamUpdate is one Adam step on a piece of a parameter: the vector kernel
// takes what it can, the loop the rest.
func adamUpdate(w, g, m, v []float32, k *adamCoef) {
	g, m, v = g[:len(w)], m[:len(w)], v[:len(w)]
	n := adamVector(w, g, m, v, k)
	w, g, m, v = w[n:], g[n:], m[n:], v[n:]
	g, m, v = g[:len(w)], m[:len(w)], v[:len(w)]
	for i := range w {
		d := g[i]
		if k.decay {
			d += float32(k.wd * w[i])
		}
		mi := float32(m[i]*k.b1) + float32(k.c1*d)
		vi := float32(v[i]*k.b2) + float32(float32(k.c2*d)*d)
		m[i], v[i] = mi, vi
		denom := float32(math.Sqrt(float64(vi)))/k.bc2s + k.eps
		w[i] -= float32(k.stepSize * (mi / denom))
		g[i] = 0
	}
}
