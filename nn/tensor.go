package nn

import (
	"gorgonia.org/tensor"
)

// Tensor is ppnode's tensor type.
type Tensor = tensor.Dense

// New returns a zeroed float32 tensor of the given shape.
func New(shape ...int) *Tensor {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return FromData(make([]float32, n), shape...)
}

// FromData wraps data (not copied) as a tensor of the given shape.
func FromData(data []float32, shape ...int) *Tensor {
	if len(shape) == 0 {
		shape = []int{len(data)}
	}
	return tensor.New(tensor.WithShape(shape...), tensor.WithBacking(data))
}

// F32 returns the tensor's backing slice.
func F32(t *Tensor) []float32 { return t.Float32s() }

// Rows returns the first dimension; Cols the product of the others.
func Rows(t *Tensor) int { return t.Shape()[0] }

// Cols returns the product of all dimensions but the first.
func Cols(t *Tensor) int {
	s := t.Shape()
	n := 1
	for _, d := range s[1:] {
		n *= d
	}
	return n
}

// Size is the product of the dimensions.
func Size(shape []int) int {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return n
}

// SameShape reports whether two shapes are equal.
func SameShape(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// Slot holds one layer's buffers for one micro-batch in flight. Buffers are
// kept across steps and reallocated only when a shape changes.
type Slot struct {
	bufs []*Tensor
	ints [][]int32
	dims []int
	// outs is the slice of input gradients a layer returns from Backward.
	outs []*Tensor
	// reluAfter is set by the Stage: the layer (a BatchNorm) applies the
	// ReLU that follows it, in its own passes.
	reluAfter bool
}

// Buf returns buffer i with the given shape; its contents are whatever the
// last use left there.
func (s *Slot) Buf(i int, shape ...int) *Tensor {
	for len(s.bufs) <= i {
		s.bufs = append(s.bufs, nil)
	}
	t := s.bufs[i]
	if t != nil && SameShape(t.Shape(), shape) {
		return t
	}
	if t != nil && cap(F32(t)) >= Size(shape) {
		t = FromData(F32(t)[:Size(shape)], shape...)
	} else {
		t = New(shape...)
	}
	s.bufs[i] = t
	return t
}

// ZeroBuf is Buf with the contents set to zero.
func (s *Slot) ZeroBuf(i int, shape ...int) *Tensor {
	t := s.Buf(i, shape...)
	clear(F32(t))
	return t
}

// Ints returns int32 buffer i of length n.
func (s *Slot) Ints(i, n int) []int32 {
	for len(s.ints) <= i {
		s.ints = append(s.ints, nil)
	}
	if cap(s.ints[i]) < n {
		s.ints[i] = make([]int32, n)
	}
	s.ints[i] = s.ints[i][:n]
	return s.ints[i]
}

// Grads returns a reusable slice of n input gradients, all nil.
func (s *Slot) Grads(n int) []*Tensor {
	if cap(s.outs) < n {
		s.outs = make([]*Tensor, n)
	}
	s.outs = s.outs[:n]
	clear(s.outs)
	return s.outs
}
