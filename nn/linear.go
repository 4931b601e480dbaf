package nn

import "fmt"

// Linear is y = x·Wᵀ + b with W of shape [out, in]. Inputs with more than one
// per-sample dimension are flattened.
type Linear struct {
	In, Out int
	W, B    *Param
	// He selects He initialisation (for layers followed by ReLU) instead of
	// PyTorch's default.
	He bool
}

// NewLinear returns a Linear layer with bias, initialised He-uniform
// (suited to a ReLU after it).
func NewLinear(in, out int) *Linear { return &Linear{In: in, Out: out, He: true} }

func (l *Linear) Kind() string { return "linear" }

func (l *Linear) Build(in [][]int) ([]int, error) {
	if len(in) != 1 {
		return nil, fmt.Errorf("takes one input, got %d", len(in))
	}
	if Size(in[0]) != l.In {
		return nil, fmt.Errorf("input %v has %d features, want %d", in[0], Size(in[0]), l.In)
	}
	init := InitUniform
	if l.He {
		init = InitHe
	}
	l.W = newParam([]int{l.Out, l.In}, init, l.In)
	l.W.Name = "weight"
	l.B = newParam([]int{l.Out}, InitZero, l.In)
	l.B.Name = "bias"
	return []int{l.Out}, nil
}

func (l *Linear) Params() []*Param { return []*Param{l.W, l.B} }

func (l *Linear) Forward(c *Ctx, s *Slot, in []*Tensor) *Tensor {
	x := in[0]
	n := Rows(x)
	y := s.Buf(0, n, l.Out)
	yd, b := F32(y), F32(l.B.Value)
	for i := 0; i < n; i++ {
		copy(yd[i*l.Out:(i+1)*l.Out], b)
	}
	c.Backend.Sgemm(false, true, n, l.Out, l.In, 1, F32(x), l.In, F32(l.W.Value), l.In, 1, yd, l.Out)
	return y
}

func (l *Linear) Backward(c *Ctx, s *Slot, in []*Tensor, out, dout *Tensor, need []bool) []*Tensor {
	x := in[0]
	n := Rows(x)
	dy := F32(dout)
	// dW += dyᵀ·x, db += column sums of dy (rows in order).
	c.Backend.Sgemm(true, false, l.Out, l.In, n, 1, dy, l.Out, F32(x), l.In, 1, F32(l.W.Grad), l.In)
	colSumAdd(F32(l.B.Grad), dy, n, l.Out)
	g := s.Grads(1)
	if need[0] {
		dx := s.Buf(1, x.Shape()...)
		c.Backend.Sgemm(false, false, n, l.In, l.Out, 1, dy, l.Out, F32(l.W.Value), l.In, 0, F32(dx), l.In)
		g[0] = dx
	}
	return g
}

// colSumAdd adds the column sums of the rows×cols matrix m to dst, summing
// each column in row order.
func colSumAdd(dst, m []float32, rows, cols int) {
	for i := 0; i < rows; i++ {
		r := m[i*cols : (i+1)*cols]
		for j := range r {
			dst[j] += r[j]
		}
	}
}
