package nn

import (
	"fmt"
	"sort"
)

// maxPermAxes bounds the axes a permutation has left after merging (see
// Permute.Build), so the copy loop keeps its index on the stack.
const maxPermAxes = 16

// Permute reorders the per-sample axes, the batch axis staying first:
// output axis i is input axis Perm[i], so Perm [2, 0, 1] turns [H, W, C]
// into [C, H, W] and [1, 2, 0] turns [C, H, W] into [H, W, C]. (An ONNX
// Transpose's perm includes the batch axis: drop its leading 0 and subtract
// one from the rest.) Forward and backward copy; a permutation that moves
// no data (the identity, or moves of size-1 axes) returns a view.
type Permute struct {
	Perm []int

	out      []int    // per-sample output shape
	per      int      // elements per sample
	identity bool     // no data moves: Forward returns a view
	fwd, bwd permPlan // the copies of Forward and Backward
}

// permPlan is a strided copy: the destination is walked in order over dims
// (outermost first) while the source index advances by strides.
type permPlan struct {
	dims, strides []int
}

func (l *Permute) Kind() string     { return "permute" }
func (l *Permute) Params() []*Param { return nil }

// Build merges axes that stay adjacent and drops size-1 axes, so the copy
// runs over as few axes as possible with its longest rows.
func (l *Permute) Build(in [][]int) ([]int, error) {
	if len(in) != 1 {
		return nil, fmt.Errorf("takes one input, got %d", len(in))
	}
	d, p := in[0], l.Perm
	if len(p) != len(d) {
		return nil, fmt.Errorf("permutation %v has %d axes, input %v has %d", p, len(p), d, len(d))
	}
	seen := make([]bool, len(d))
	for _, a := range p {
		if a < 0 || a >= len(d) || seen[a] {
			return nil, fmt.Errorf("%v is not a permutation of %d axes", p, len(d))
		}
		seen[a] = true
	}
	for _, n := range d {
		if n < 1 {
			return nil, fmt.Errorf("input %v has an empty axis", d)
		}
	}
	l.out = make([]int, len(p))
	for i, a := range p {
		l.out[i] = d[a]
	}
	l.per = Size(d)

	// Groups of input axes that stay adjacent, in output order: next[a] is
	// the input axis after a once size-1 axes are dropped.
	next := make([]int, len(d)+1)
	next[len(d)] = -1
	for a := len(d) - 1; a >= 0; a-- {
		next[a] = a + 1
		if a+1 < len(d) && d[a+1] == 1 {
			next[a] = next[a+1]
		}
	}
	type group struct{ first, size int }
	var groups []group
	prev := len(d)
	for _, a := range p {
		if d[a] == 1 {
			continue
		}
		if len(groups) > 0 && next[prev] == a {
			groups[len(groups)-1].size *= d[a]
		} else {
			groups = append(groups, group{a, d[a]})
		}
		prev = a
	}
	if len(groups) > maxPermAxes {
		return nil, fmt.Errorf("permutation %v moves more than %d separate axes", p, maxPermAxes)
	}
	// rank[g] is group g's position in the input.
	order := make([]int, len(groups))
	for g := range order {
		order[g] = g
	}
	sort.Slice(order, func(i, j int) bool { return groups[order[i]].first < groups[order[j]].first })
	rank := make([]int, len(groups))
	l.identity = true
	for r, g := range order {
		rank[g] = r
		l.identity = l.identity && r == g
	}
	if l.identity {
		return append([]int(nil), l.out...), nil
	}
	// Row-major strides of the merged input and of the merged output.
	inDims := make([]int, len(groups))
	for g, gr := range groups {
		inDims[rank[g]] = gr.size
	}
	inStride, outStride := make([]int, len(groups)), make([]int, len(groups))
	for i, si, so := len(groups)-1, 1, 1; i >= 0; i-- {
		inStride[i], outStride[i] = si, so
		si *= inDims[i]
		so *= groups[i].size
	}
	l.fwd = permPlan{dims: make([]int, len(groups)), strides: make([]int, len(groups))}
	l.bwd = permPlan{dims: inDims, strides: make([]int, len(groups))}
	for g, gr := range groups {
		l.fwd.dims[g], l.fwd.strides[g] = gr.size, inStride[rank[g]]
		l.bwd.strides[rank[g]] = outStride[g]
	}
	return append([]int(nil), l.out...), nil
}

func (l *Permute) Forward(c *Ctx, s *Slot, in []*Tensor) *Tensor {
	x := in[0]
	shape := s.withBatch(Rows(x), l.out)
	if l.identity {
		return view(s, 0, x, shape...)
	}
	y := s.Buf(0, shape...)
	l.fwd.run(c, F32(y), F32(x), Rows(x), l.per)
	return y
}

// Backward applies the inverse permutation to dout.
func (l *Permute) Backward(c *Ctx, s *Slot, in []*Tensor, out, dout *Tensor, need []bool) []*Tensor {
	g := s.Grads(1)
	if !need[0] {
		return g
	}
	if l.identity {
		g[0] = view(s, 1, dout, in[0].Shape()...)
		return g
	}
	dx := s.Buf(1, in[0].Shape()...)
	l.bwd.run(c, F32(dx), F32(dout), Rows(dout), l.per)
	g[0] = dx
	return g
}

// run copies n samples of per elements from src to dst, in parallel chunks
// of destination rows (the last axis of p.dims); each chunk writes only its
// rows.
func (p *permPlan) run(c *Ctx, dst, src []float32, n, per int) {
	dims, strides := p.dims, p.strides
	k := len(dims)
	last, step := dims[k-1], strides[k-1]
	rowsPer := per / last
	parallel(threadsOf(c), n*rowsPer, max(1, cheapGrain/last), func(lo, hi int) {
		// idx is the destination row's index over dims[:k-1]; off its
		// source offset within sample b.
		var idx [maxPermAxes]int
		b, r, off := lo/rowsPer, lo%rowsPer, 0
		for i := k - 2; i >= 0; i-- {
			idx[i] = r % dims[i]
			r /= dims[i]
			off += idx[i] * strides[i]
		}
		for row := lo; row < hi; row++ {
			d, sr := dst[row*last:(row+1)*last], src[b*per+off:]
			if step == 1 {
				copy(d, sr[:last])
			} else {
				for j := range d {
					d[j] = sr[j*step]
				}
			}
			i := k - 2
			for ; i >= 0; i-- {
				idx[i]++
				off += strides[i]
				if idx[i] < dims[i] {
					break
				}
				idx[i] = 0
				off -= dims[i] * strides[i]
			}
			if i < 0 {
				b++
			}
		}
	})
}

// withBatch returns the reusable shape [n, per...].
func (s *Slot) withBatch(n int, per []int) []int {
	s.dims = append(append(s.dims[:0], n), per...)
	return s.dims
}

// Reshape gives each sample the shape Shape (no -1: the importer resolves
// it), of the same size as the input's. The output shares the input's
// memory, as Flatten's does.
type Reshape struct{ Shape []int }

func (l *Reshape) Kind() string     { return "reshape" }
func (l *Reshape) Params() []*Param { return nil }

func (l *Reshape) Build(in [][]int) ([]int, error) {
	if len(in) != 1 {
		return nil, fmt.Errorf("takes one input, got %d", len(in))
	}
	for _, n := range l.Shape {
		if n < 1 {
			return nil, fmt.Errorf("shape %v has a dimension below 1", l.Shape)
		}
	}
	if Size(l.Shape) != Size(in[0]) {
		return nil, fmt.Errorf("shape %v has %d elements, input %v has %d", l.Shape, Size(l.Shape), in[0], Size(in[0]))
	}
	return append([]int(nil), l.Shape...), nil
}

func (l *Reshape) Forward(c *Ctx, s *Slot, in []*Tensor) *Tensor {
	return view(s, 0, in[0], s.withBatch(Rows(in[0]), l.Shape)...)
}

func (l *Reshape) Backward(c *Ctx, s *Slot, in []*Tensor, out, dout *Tensor, need []bool) []*Tensor {
	g := s.Grads(1)
	if need[0] {
		g[0] = view(s, 1, dout, in[0].Shape()...)
	}
	return g
}
