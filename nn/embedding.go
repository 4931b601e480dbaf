package nn

import "fmt"

// Embedding looks up rows of its table: the input, of any per-sample shape
// S, holds token ids in [0, Num) as exact float32 integers, and the output
// S ++ [Dim] holds row id of "weight" [Num, Dim] for each id. The weight
// starts uniform in ±1 (Init InitUniform with fan-in 1; PyTorch draws
// N(0, 1), which no Init kind gives): an importer supplies the trained
// table.
type Embedding struct {
	Num, Dim int
	W        *Param
	// Padded makes row PaddingIdx take no gradient from the lookups
	// (PyTorch's padding_idx): padding positions leave it as it is.
	Padded     bool
	PaddingIdx int
}

func (l *Embedding) Kind() string     { return "embedding" }
func (l *Embedding) Params() []*Param { return []*Param{l.W} }

// IntInput reports that input 0 takes integers in [0, Num), so that a
// profiler feeds it valid ids.
func (l *Embedding) IntInput(i int) (limit int, ok bool) {
	if i == 0 {
		return l.Num, true
	}
	return 0, false
}

func (l *Embedding) Build(in [][]int) ([]int, error) {
	if len(in) != 1 {
		return nil, fmt.Errorf("takes one input, got %d", len(in))
	}
	if l.Num < 1 || l.Dim < 1 {
		return nil, fmt.Errorf("table [%d, %d] is empty", l.Num, l.Dim)
	}
	l.W = newParam([]int{l.Num, l.Dim}, InitUniform, 1)
	l.W.Name = "weight"
	return append(append([]int(nil), in[0]...), l.Dim), nil
}

// Forward checks the ids and saves them (ints 0) for Backward.
func (l *Embedding) Forward(c *Ctx, s *Slot, in []*Tensor) *Tensor {
	x := F32(in[0])
	ids := s.Ints(0, len(x))
	for i, v := range x {
		id := int32(v)
		if float32(id) != v || id < 0 || int(id) >= l.Num {
			panic(fmt.Sprintf("nn: embedding: id %v at position %d is not an integer in [0, %d)", v, i, l.Num))
		}
		ids[i] = id
	}
	s.dims = append(append(s.dims[:0], in[0].Shape()...), l.Dim)
	y := s.Buf(0, s.dims...)
	yd, w, d := F32(y), F32(l.W.Value), l.Dim
	parallel(threadsOf(c), len(ids), max(1, cheapGrain/d), func(lo, hi int) {
		for i := lo; i < hi; i++ {
			copy(yd[i*d:(i+1)*d], w[int(ids[i])*d:])
		}
	})
	return y
}

// Backward adds each position's output gradient to its id's row of the
// weight gradient, positions in ascending order, each column chunk by one
// goroutine; it touches only the rows of ids seen (not the padding row).
// The ids get no gradient.
func (l *Embedding) Backward(c *Ctx, s *Slot, in []*Tensor, out, dout *Tensor, need []bool) []*Tensor {
	ids := s.Ints(0, len(F32(in[0])))
	dy, dw, d := F32(dout), F32(l.W.Grad), l.Dim
	pad := int32(-1)
	if l.Padded {
		pad = int32(l.PaddingIdx)
	}
	columnChunks(c, len(ids), d, func(lo, hi int) {
		for i, id := range ids {
			if id == pad {
				continue
			}
			row := dw[int(id)*d+lo : int(id)*d+hi]
			for j, v := range dy[i*d+lo : i*d+hi] {
				row[j] += v
			}
		}
	})
	return s.Grads(1)
}
