package nn

import (
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"slices"
)

// Init says how a parameter starts.
type Init int

//go:generate stringer -type=Init
const (
	InitZero    Init = iota // all zeros
	InitOne                 // all ones
	InitHe                  // uniform ±sqrt(6/fanIn): keeps ReLU nets' activations at scale
	InitUniform             // uniform ±1/sqrt(fanIn): PyTorch's default for Linear and Conv
)

// Param is a named parameter tensor with its gradient. Buffers (BatchNorm's
// running statistics, a model file's constants) are Params with Grad ==
// nil: they are saved and hashed but not optimised.
type Param struct {
	Name  string
	Value *Tensor
	Grad  *Tensor
	Init  Init
	FanIn int
	// Given, when set, is the initial value (in Value's layout) that Reset
	// copies instead of drawing from Init: weights from a file.
	Given []float32
	// Layout permutes Value's axes into the exported (PyTorch) layout:
	// exported axis i is Value's axis Layout[i]. Nil is Value's own.
	Layout []int
	// Aliases are further names of the tensor in the exported module's
	// state_dict (tied weights there: one tensor under several names).
	Aliases []string
	// Running marks a buffer that training passes update (running
	// statistics): replicas of a stage would each see other micro-batches.
	Running bool
	// Frozen keeps a parameter out of training (PyTorch's
	// requires_grad=False): no update, no decay, no part in the gradients'
	// norm or sums (Graph.Freeze). A layer may still fill its Grad.
	Frozen bool
}

func newParam(shape []int, init Init, fanIn int) *Param {
	return &Param{Value: New(shape...), Grad: New(shape...), Init: init, FanIn: fanIn}
}

func newBuffer(shape []int, init Init) *Param {
	return &Param{Value: New(shape...), Init: init, Running: true}
}

// Trainable reports whether the optimizer updates p.
func (p *Param) Trainable() bool { return p.Grad != nil && !p.Frozen }

// Frozen reports whether l has parameters and none of them trains: its
// backward pass needs no parameter gradients, only its input gradients.
func Frozen(l Layer) bool {
	ps := l.Params()
	return len(ps) > 0 && !slices.ContainsFunc(ps, (*Param).Trainable)
}

// Reset sets p to its initial value, drawn from a generator seeded by
// (seed, p.Name) alone, so a parameter starts the same wherever it lives.
func (p *Param) Reset(seed uint64) {
	v := F32(p.Value)
	switch {
	case p.Given != nil:
		copy(v, p.Given)
	case p.Init == InitZero:
		clear(v)
	case p.Init == InitOne:
		for i := range v {
			v[i] = 1
		}
	default:
		p.draw(seed, v)
	}
	if p.Grad != nil {
		clear(F32(p.Grad))
	}
}

func (p *Param) draw(seed uint64, v []float32) {
	switch p.Init {
	case InitZero:
		clear(v)
	case InitOne:
		for i := range v {
			v[i] = 1
		}
	case InitHe, InitUniform:
		bound := 1 / math.Sqrt(float64(p.FanIn))
		if p.Init == InitHe {
			bound = math.Sqrt(6 / float64(p.FanIn))
		}
		r := NewRand(seed, nameHash(p.Name))
		for i := range v {
			v[i] = float32((2*r.Float64() - 1) * bound)
		}
	}
}

// NewRand returns a generator seeded by the given words; it is the only
// source of randomness in ppnode's training.
func NewRand(seed uint64, words ...uint64) *rand.Rand {
	h := seed ^ 0x9e3779b97f4a7c15
	for _, w := range words {
		h = mix64(h ^ mix64(w+0x632be59bd9b4e019))
	}
	return rand.New(rand.NewPCG(h, mix64(h+1)))
}

// mix64 is splitmix64's finaliser.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

func nameHash(s string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(s))
	return h.Sum64()
}

// ExportedShape is Value's shape in the exported layout.
func (p *Param) ExportedShape() []int { return permuteShape(p.Value.Shape(), p.Layout) }

// Exported returns the value in the exported layout: Value itself when the
// layouts agree, else a permuted copy.
func (p *Param) Exported() *Tensor {
	if p.Layout == nil {
		return p.Value
	}
	shape := p.Value.Shape()
	out := New(permuteShape(shape, p.Layout)...)
	permuteInto(F32(out), F32(p.Value), shape, p.Layout)
	return out
}

// FromExported converts data of the exported shape into Value's layout,
// for Given or to load Value; it returns an error naming the shapes when
// they differ.
func (p *Param) FromExported(data []float32, shape []int) ([]float32, error) {
	want := p.ExportedShape()
	if !SameShape(shape, want) || len(data) != Size(want) {
		return nil, fmt.Errorf("%s: shape %v, want %v", p.Name, shape, want)
	}
	out := make([]float32, len(data))
	if p.Layout == nil {
		copy(out, data)
		return out, nil
	}
	inv := make([]int, len(p.Layout))
	for i, a := range p.Layout {
		inv[a] = i
	}
	permuteInto(out, data, want, inv)
	return out, nil
}

func permuteShape(shape, perm []int) []int {
	if perm == nil {
		return append([]int(nil), shape...)
	}
	out := make([]int, len(perm))
	for i, a := range perm {
		out[i] = shape[a]
	}
	return out
}

// permuteInto writes src (of shape) with its axes permuted by perm into
// dst: dst's axis i is src's axis perm[i].
func permuteInto(dst, src []float32, shape, perm []int) {
	n := len(shape)
	stride := make([]int, n) // src strides
	s := 1
	for i := n - 1; i >= 0; i-- {
		stride[i] = s
		s *= shape[i]
	}
	dims := permuteShape(shape, perm)
	idx := make([]int, n)
	for o := range dst {
		off := 0
		for i, a := range perm {
			off += idx[i] * stride[a]
		}
		dst[o] = src[off]
		for i := n - 1; i >= 0; i-- {
			if idx[i]++; idx[i] < dims[i] {
				break
			}
			idx[i] = 0
		}
	}
}
