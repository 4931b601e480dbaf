package nn

import "fmt"

// Linear is y = x·Wᵀ + b with W of shape [out, in] (or y = x·W with W of
// shape [in, out] when Transposed; without b when NoBias). Inputs with more
// than one per-sample dimension are flattened.
type Linear struct {
	In, Out int
	W, B    *Param // B is nil with NoBias
	// He selects He initialisation (for layers followed by ReLU) instead of
	// PyTorch's default.
	He bool
	// NoBias drops the bias: y = x·Wᵀ, and Params returns W alone.
	NoBias bool
	// Transposed stores W as [in, out], y = x·W, the layout of an ONNX
	// MatMul's second operand or of a Gemm with transB = 0.
	Transposed bool
	// Last applies the product along the last per-sample axis, each
	// position on its own: [T, in] to [T, out] (a transformer's tokens),
	// instead of flattening the sample.
	Last bool

	// The bias gradient's pass in progress (a Layer serves one pass at a
	// time).
	dy      []float32
	rowsDy  int
	sumBias func(lo, hi int)
}

// biasColumns adds columns [lo, hi) of the pass's dy to the bias gradient.
func (l *Linear) biasColumns(lo, hi int) {
	d, out := F32(l.B.Grad)[lo:hi], l.Out
	for r := 0; r < l.rowsDy; r++ {
		for j, v := range l.dy[r*out+lo : r*out+hi] {
			d[j] += v
		}
	}
}

// NewLinear returns a Linear layer with bias, initialised He-uniform
// (suited to a ReLU after it).
func NewLinear(in, out int) *Linear { return &Linear{In: in, Out: out, He: true} }

func (l *Linear) Kind() string { return "linear" }

func (l *Linear) Build(in [][]int) ([]int, error) {
	if len(in) != 1 {
		return nil, fmt.Errorf("takes one input, got %d", len(in))
	}
	out := []int{l.Out}
	switch {
	case l.Last:
		if len(in[0]) == 0 || in[0][len(in[0])-1] != l.In {
			return nil, fmt.Errorf("input %v has not %d features on its last axis", in[0], l.In)
		}
		out = append(append([]int(nil), in[0][:len(in[0])-1]...), l.Out)
	case Size(in[0]) != l.In:
		return nil, fmt.Errorf("input %v has %d features, want %d", in[0], Size(in[0]), l.In)
	}
	init := InitUniform
	if l.He {
		init = InitHe
	}
	shape := []int{l.Out, l.In}
	if l.Transposed {
		shape = []int{l.In, l.Out}
	}
	l.W = newParam(shape, init, l.In)
	l.W.Name = "weight"
	l.B = nil
	if !l.NoBias {
		l.B = newParam([]int{l.Out}, InitZero, l.In)
		l.B.Name = "bias"
	}
	return out, nil
}

func (l *Linear) Params() []*Param {
	if l.NoBias {
		return []*Param{l.W}
	}
	return []*Param{l.W, l.B}
}

// ldw is W's leading dimension (its row length).
func (l *Linear) ldw() int {
	if l.Transposed {
		return l.Out
	}
	return l.In
}

// rows is the number of products of a pass: samples, or positions with Last.
func (l *Linear) rows(x *Tensor) int { return len(F32(x)) / l.In }

func (l *Linear) Forward(c *Ctx, s *Slot, in []*Tensor) *Tensor {
	x := in[0]
	n := l.rows(x)
	var y *Tensor
	if l.Last {
		y = s.Buf(0, s.shape(x.Shape(), l.Out)...)
	} else {
		y = s.Buf(0, Rows(x), l.Out)
	}
	yd := F32(y)
	var beta float32
	if !l.NoBias {
		b := F32(l.B.Value)
		for i := 0; i < n; i++ {
			copy(yd[i*l.Out:(i+1)*l.Out], b)
		}
		beta = 1
	}
	c.Backend.Sgemm(false, !l.Transposed, n, l.Out, l.In, 1, F32(x), l.In, F32(l.W.Value), l.ldw(), beta, yd, l.Out)
	return y
}

func (l *Linear) Backward(c *Ctx, s *Slot, in []*Tensor, out, dout *Tensor, need []bool) []*Tensor {
	l.BackwardWeight(c, s, in, out, dout)
	return l.BackwardInput(c, s, in, out, dout, need)
}

// Splits: a Linear layer always splits its backward pass (SplitLayer).
func (l *Linear) Splits(c *Ctx) bool { return true }

// BackwardWeight adds dW and db.
func (l *Linear) BackwardWeight(c *Ctx, s *Slot, in []*Tensor, out, dout *Tensor) {
	x := in[0]
	n := l.rows(x)
	dy := F32(dout)
	if l.Transposed {
		// dW += xᵀ·dy.
		c.Backend.Sgemm(true, false, l.In, l.Out, n, 1, F32(x), l.In, dy, l.Out, 1, F32(l.W.Grad), l.Out)
	} else {
		// dW += dyᵀ·x.
		c.Backend.Sgemm(true, false, l.Out, l.In, n, 1, dy, l.Out, F32(x), l.In, 1, F32(l.W.Grad), l.In)
	}
	if !l.NoBias {
		// db += column sums of dy (rows in order), columns over the threads.
		l.dy, l.rowsDy = dy, n
		if l.sumBias == nil {
			l.sumBias = l.biasColumns // made once: a closure a pass would allocate
		}
		columnChunks(c, n, l.Out, l.sumBias)
		l.dy = nil
	}
}

// BackwardInput returns dx.
func (l *Linear) BackwardInput(c *Ctx, s *Slot, in []*Tensor, out, dout *Tensor, need []bool) []*Tensor {
	x := in[0]
	n := l.rows(x)
	dy := F32(dout)
	g := s.Grads(1)
	if need[0] {
		dx := s.Buf(1, x.Shape()...)
		c.Backend.Sgemm(false, l.Transposed, n, l.In, l.Out, 1, dy, l.Out, F32(l.W.Value), l.ldw(), 0, F32(dx), l.In)
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
