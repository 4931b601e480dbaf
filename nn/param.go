package nn

import (
	"hash/fnv"
	"math"
	"math/rand/v2"
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
// running statistics) are Params with Grad == nil: they are saved and hashed
// but not optimised.
type Param struct {
	Name  string
	Value *Tensor
	Grad  *Tensor
	Init  Init
	FanIn int
}

func newParam(shape []int, init Init, fanIn int) *Param {
	return &Param{Value: New(shape...), Grad: New(shape...), Init: init, FanIn: fanIn}
}

func newBuffer(shape []int, init Init) *Param {
	return &Param{Value: New(shape...), Init: init}
}

// Trainable reports whether the optimizer updates p.
func (p *Param) Trainable() bool { return p.Grad != nil }

// Reset sets p to its initial value, drawn from a generator seeded by
// (seed, p.Name) alone, so a parameter starts the same wherever it lives.
func (p *Param) Reset(seed uint64) {
	v := F32(p.Value)
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
	if p.Grad != nil {
		clear(F32(p.Grad))
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
