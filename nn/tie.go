package nn

import (
	"fmt"
	"slices"
)

// Tied weights: one tensor of a model read by several layers (a language
// model's output projection tied to its token embedding, a module applied
// twice). Each reading layer holds a copy, a Param of the same name, shape
// and layout; every copy gets the sum of the copies' gradients, added in
// node order, and the optimizer then steps each copy the same way, so the
// copies stay equal bit for bit wherever they live.

// Ties returns the trainable parameters of ps that share a name, a group
// per name in the order of its first member, each group in ps's order.
func Ties(ps []*Param) [][]*Param {
	at := map[string]int{}
	var groups [][]*Param
	for _, p := range ps {
		if !p.Trainable() {
			continue
		}
		if i, ok := at[p.Name]; ok {
			groups[i] = append(groups[i], p)
			continue
		}
		at[p.Name] = len(groups)
		groups = append(groups, []*Param{p})
	}
	out := groups[:0]
	for _, g := range groups {
		if len(g) > 1 {
			out = append(out, g)
		}
	}
	return out
}

// CheckTies reports copies of one tied tensor that differ in shape or
// layout (their gradients could not be added element by element), and
// buffers of one name in two layers (a BatchNorm applied twice: PyTorch
// updates one running mean from both uses, copies would each keep their
// own).
func CheckTies(ps []*Param) error {
	buffers := map[string]bool{}
	for _, p := range ps {
		if !p.Trainable() {
			if buffers[p.Name] {
				return fmt.Errorf("nn: buffer %q is read by two layers (a BatchNorm applied twice?); shared buffers are not supported", p.Name)
			}
			buffers[p.Name] = true
		}
	}
	for _, g := range Ties(ps) {
		for _, p := range g[1:] {
			if !SameShape(p.Value.Shape(), g[0].Value.Shape()) || !slices.Equal(p.Layout, g[0].Layout) {
				return fmt.Errorf("nn: the copies of tied parameter %q differ: shape %v layout %v and shape %v layout %v",
					p.Name, g[0].Value.Shape(), g[0].Layout, p.Value.Shape(), p.Layout)
			}
		}
	}
	return nil
}

// SumTies gives every copy of each group the sum of the group's gradients
// ((g0 + g1) + g2 ..., in group order); grads[i], if set, stands for
// group member i's gradient (a copy on another stage). The sum goes into
// each member's Grad that grads does not name. It is added element by
// element, so that a copy here that some copy elsewhere precedes needs no
// buffer for its own gradient while the sum is formed.
func SumTies(group []*Param, grads []*Tensor) {
	src := make([][]float32, len(group))
	var dst [][]float32
	for i, p := range group {
		if i < len(grads) && grads[i] != nil {
			src[i] = F32(grads[i])
			continue
		}
		src[i] = F32(p.Grad)
		dst = append(dst, src[i])
	}
	for j := range src[0] {
		sum := src[0][j]
		for _, g := range src[1:] {
			sum += g[j]
		}
		for _, d := range dst {
			d[j] = sum
		}
	}
}

// Unique returns ps without the later copies of tied parameters: the
// model's tensors, each once (for files, hashes and counts).
func Unique(ps []*Param) []*Param {
	seen := map[string]bool{}
	out := make([]*Param, 0, len(ps))
	for _, p := range ps {
		if p.Trainable() && seen[p.Name] {
			continue
		}
		seen[p.Name] = true
		out = append(out, p)
	}
	return out
}
