package nn

import "fmt"

// Carry passes its input through and holds parameters that no layer
// computes with: an imported model's buffers that only shaped constants
// (a causal mask, position indices), kept so that the model's weights
// file has every tensor of its state_dict.
type Carry struct {
	Buffers []*Param
}

func (l *Carry) Kind() string     { return "carry" }
func (l *Carry) Params() []*Param { return l.Buffers }

func (l *Carry) Build(in [][]int) ([]int, error) {
	if len(in) != 1 {
		return nil, fmt.Errorf("takes one input, got %d", len(in))
	}
	for _, p := range l.Buffers {
		if p.Trainable() {
			return nil, fmt.Errorf("carries buffers only; %q is trainable", p.Name)
		}
	}
	return append([]int(nil), in[0]...), nil
}

func (l *Carry) Forward(c *Ctx, s *Slot, in []*Tensor) *Tensor { return in[0] }

func (l *Carry) Backward(c *Ctx, s *Slot, in []*Tensor, out, dout *Tensor, need []bool) []*Tensor {
	g := s.Grads(1)
	if need[0] {
		g[0] = dout
	}
	return g
}
