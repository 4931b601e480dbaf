package onnx

import (
	"fmt"
	"slices"

	"github.com/ppnode/ppnode/nn"
)

// # Values and their views
//
// An ONNX tensor computed from the data is a value: a tensor of the graph
// being built, which ppnode stores batch first (the stored axes: 0 the
// batch, 1.. a sample's axes, as the graph's shapes give them), seen
// through a view that says which stored axes each ONNX axis spans. An
// ONNX axis spans one stored axis, several (a merged axis: the ONNX index
// is their row-major index, outermost first), or none (an axis of size 1).
// Transpose, Reshape, Flatten, Squeeze and Unsqueeze only change the view,
// so the batch axis may lie anywhere in ONNX's shape ([T, N, D] in
// PyTorch's attention, [N·H, T, D/H] for its heads) while every layer and
// every tensor between stages keeps it first. Data moves (an nn.Permute)
// only where a layer needs its axes in an order the stored tensor does not
// have.

// value is an activation of the graph being built.
type value struct {
	name   string  // the graph's tensor
	stored []int   // its per-sample shape (stored axes 1..)
	dims   [][]int // per ONNX axis, the stored axes it spans, outermost first (0: the batch)
	isInt  bool    // holds integers (token ids), which carry no gradient
}

// size of stored axis a (a >= 1).
func (v *value) axisSize(a int) int { return v.stored[a-1] }

// dim is the size of ONNX axis d.
func (v *value) dim(d int) sym {
	s := sym{c: 1}
	for _, a := range v.dims[d] {
		if a == 0 {
			s.n = true
		} else {
			s.c *= int64(v.axisSize(a))
		}
	}
	return s
}

// shape is the ONNX shape.
func (v *value) shape() []sym {
	out := make([]sym, len(v.dims))
	for d := range v.dims {
		out[d] = v.dim(d)
	}
	return out
}

func (v *value) rank() int { return len(v.dims) }

// plain reports whether ONNX axis 0 is the batch alone, so that the other
// axes are a sample's.
func (v *value) plain() bool {
	return len(v.dims) > 0 && slices.Equal(v.dims[0], []int{0})
}

// sampleShape is the ONNX shape without the batch axis of a plain value.
func (v *value) sampleShape() []int {
	out := make([]int, len(v.dims)-1)
	for d := range out {
		out[d] = int(v.dim(d + 1).c)
	}
	return out
}

func (v *value) String() string { return fmt.Sprint(v.shape()) }

// newValue is the value of a layer's output named name, stored as the
// builder says, with the view dims.
func (im *importer) newValue(name string, dims [][]int, isInt bool) *value {
	st := im.b.Shape(name)
	if st == nil { // the builder failed; its error is returned at the end
		st = make([]int, 0)
	}
	return &value{name: name, stored: slices.Clone(st), dims: dims, isInt: isInt}
}

// owner maps each stored axis to the ONNX axis that spans it (-1: none, a
// stored axis of size 1 no ONNX axis needs).
func (v *value) owner() []int {
	o := make([]int, len(v.stored)+1)
	for a := range o {
		o[a] = -1
	}
	for d, as := range v.dims {
		for _, a := range as {
			o[a] = d
		}
	}
	return o
}

// permute reorders the stored axes: new axis i+1 is old axis order[i]
// (order holds 1..len(stored); the batch stays first).
func (im *importer) permute(v *value, order []int) *value {
	identity := true
	for i, a := range order {
		identity = identity && a == i+1
	}
	if identity {
		return v
	}
	perm := make([]int, len(order))
	where := make([]int, len(order)+1)
	for i, a := range order {
		perm[i] = a - 1
		where[a] = i + 1
	}
	dims := make([][]int, len(v.dims))
	for d, as := range v.dims {
		dims[d] = make([]int, len(as))
		for j, a := range as {
			if a != 0 {
				a = where[a]
			}
			dims[d][j] = a
		}
	}
	name := im.add("perm", &nn.Permute{Perm: perm}, v)
	return im.newValue(name, dims, v.isInt)
}

// reshapeStored gives the stored tensor the per-sample shape (a view: the
// elements keep their order), seen through dims.
func (im *importer) reshapeStored(v *value, shape []int, dims [][]int) *value {
	if slices.Equal(shape, v.stored) {
		return &value{name: v.name, stored: v.stored, dims: dims, isInt: v.isInt}
	}
	name := im.add("view", &nn.Reshape{Shape: slices.Clone(shape)}, v)
	return im.newValue(name, dims, v.isInt)
}

// lastDims returns v stored as [batch, other axes..., ds...]: the ONNX
// axes ds last, in that order, each one stored axis (merged or of size 1
// as needed), the stored axes of the other ONNX axes before them in their
// present order. Unowned axes of size 1 are dropped.
func (im *importer) lastDims(v *value, ds ...int) (*value, error) {
	want := map[int]bool{}
	for _, d := range ds {
		if want[d] {
			return nil, fmt.Errorf("axis %d twice", d)
		}
		want[d] = true
		if slices.Contains(v.dims[d], 0) {
			return nil, fmt.Errorf("axis %d of %v holds the batch; ppnode needs it elsewhere", d, v)
		}
	}
	own := v.owner()
	var order []int
	for a := 1; a <= len(v.stored); a++ {
		if own[a] >= 0 && !want[own[a]] {
			order = append(order, a)
		}
	}
	rest := len(order)
	for _, d := range ds {
		order = append(order, v.dims[d]...)
	}
	for a := 1; a <= len(v.stored); a++ { // unowned axes of size 1 go last
		if own[a] < 0 {
			order = append(order, a)
		}
	}
	v = im.permute(v, order)
	// Now: batch, the rest's axes 1..rest, then the ds' axes in turn.
	shape := make([]int, 0, rest+len(ds))
	for a := 1; a <= rest; a++ {
		shape = append(shape, v.axisSize(a))
	}
	dims := make([][]int, len(v.dims))
	for d, as := range v.dims {
		if !want[d] {
			dims[d] = slices.Clone(as)
		}
	}
	for j, d := range ds {
		shape = append(shape, int(v.dim(d).c))
		dims[d] = []int{rest + 1 + j}
	}
	return im.reshapeStored(v, shape, dims), nil
}

// layout returns a plain value stored as [batch, ONNX axes order...], each
// ONNX axis one stored axis; order is a permutation of 1..rank-1.
func (im *importer) layout(v *value, order ...int) (*value, error) {
	if !v.plain() {
		return nil, fmt.Errorf("a value of shape %v where ppnode needs the batch as the first axis", v)
	}
	return im.lastDims(v, order...)
}

// rowMajor is layout in ONNX's own order.
func (im *importer) rowMajor(v *value) (*value, error) {
	order := make([]int, v.rank()-1)
	for i := range order {
		order[i] = i + 1
	}
	return im.layout(v, order...)
}

// single returns v with ONNX axis d spanning exactly one stored axis,
// moving as little as it can, and that axis.
func (im *importer) single(v *value, d int) (*value, int, error) {
	as := v.dims[d]
	switch {
	case slices.Contains(as, 0):
		return nil, 0, fmt.Errorf("an operation along axis %d of %v, which holds the batch", d, v)
	case len(as) == 1:
		return v, as[0], nil
	}
	consecutive := len(as) > 0
	for j := 1; j < len(as); j++ {
		consecutive = consecutive && as[j] == as[j-1]+1
	}
	if !consecutive {
		// Put the axes of d together where its first one is (or last).
		at := len(v.stored) + 1
		if len(as) > 0 {
			at = as[0]
		}
		var order []int
		for a := 1; a <= len(v.stored); a++ {
			if a == at {
				order = append(order, as...)
			}
			if !slices.Contains(as, a) {
				order = append(order, a)
			}
		}
		if at > len(v.stored) {
			order = append(order, as...)
		}
		v = im.permute(v, order)
		as = v.dims[d]
	}
	// Merge as (consecutive now), or add an axis of size 1 at the end.
	first, n := len(v.stored)+1, 0
	if len(as) > 0 {
		first, n = as[0], len(as)
	}
	var shape []int
	shape = append(shape, v.stored[:first-1]...)
	shape = append(shape, int(v.dim(d).c))
	shape = append(shape, v.stored[min(first-1+n, len(v.stored)):]...)
	shift := func(a int) int {
		if a >= first+n {
			return a - n + 1
		}
		return a
	}
	dims := make([][]int, len(v.dims))
	for e, bs := range v.dims {
		if e == d {
			dims[e] = []int{first}
			continue
		}
		for _, a := range bs {
			dims[e] = append(dims[e], shift(a))
		}
	}
	return im.reshapeStored(v, shape, dims), first, nil
}

// reshapeView rewrites v's view so that its ONNX shape is target, cutting
// stored axes where a target axis ends inside one (a view of the stored
// tensor): the elements keep their row-major order, as Reshape's do.
func (im *importer) reshapeView(v *value, target []sym) (*value, error) {
	type piece struct{ axis, part, size int }
	// The stored axes in ONNX order, those of size 1 left out.
	var seq []piece
	for _, as := range v.dims {
		for _, a := range as {
			switch {
			case a == 0:
				seq = append(seq, piece{0, 0, 0})
			case v.axisSize(a) != 1:
				seq = append(seq, piece{a, 0, v.axisSize(a)})
			}
		}
	}
	bad := func() error { return fmt.Errorf("shape %v does not fit %v without moving data", target, v) }
	parts := map[int][]int{} // stored axis -> the sizes it is cut into
	dims := make([][][2]int, len(target))
	j := 0
	for t, want := range target {
		for !(want == sym{c: 1}) {
			if j >= len(seq) || want.c < 1 {
				return nil, bad()
			}
			p := &seq[j]
			switch {
			case p.axis == 0:
				if !want.n {
					return nil, bad()
				}
				want.n = false
				dims[t] = append(dims[t], [2]int{0, 0})
				j++
			case want.c%int64(p.size) == 0:
				want.c /= int64(p.size)
				dims[t] = append(dims[t], [2]int{p.axis, p.part})
				parts[p.axis] = append(parts[p.axis], p.size)
				j++
			case !want.n && int64(p.size)%want.c == 0:
				w := int(want.c)
				want.c = 1
				dims[t] = append(dims[t], [2]int{p.axis, p.part})
				parts[p.axis] = append(parts[p.axis], w)
				p.part, p.size = p.part+1, p.size/w
			default:
				return nil, bad()
			}
		}
	}
	if j < len(seq) {
		return nil, bad()
	}
	var shape []int
	newAxis := map[[2]int]int{} // (stored axis, part) -> new stored axis
	for a := 1; a <= len(v.stored); a++ {
		ps := parts[a]
		if len(ps) == 0 {
			ps = []int{v.axisSize(a)}
		}
		for p, n := range ps {
			shape = append(shape, n)
			newAxis[[2]int{a, p}] = len(shape)
		}
	}
	out := make([][]int, len(target))
	for t, ps := range dims {
		out[t] = []int{}
		for _, p := range ps {
			if p[0] == 0 {
				out[t] = append(out[t], 0)
			} else {
				out[t] = append(out[t], newAxis[p])
			}
		}
	}
	return im.reshapeStored(v, shape, out), nil
}

// alignTo returns b stored with a's stored layout: for every stored axis
// of a, b's axis of the same extent, or an axis of size 1 where b
// broadcasts along a's ONNX axis. a and b have the same ONNX rank, their
// dimensions equal or b's 1. It fails where b's stored axes do not match
// a's (the same ONNX axis split differently).
func (im *importer) alignTo(b, a *value) (*value, error) {
	order, shape, dims, err := alignPlan(b, a)
	if err != nil {
		return nil, err
	}
	return im.reshapeStored(im.permute(b, order), shape, dims), nil
}

// alignPlan is alignTo's plan: the order of b's stored axes, then the
// per-sample shape and view of the result.
func alignPlan(b, a *value) (order, shape []int, dims [][]int, err error) {
	if b.rank() != a.rank() {
		return nil, nil, nil, fmt.Errorf("shapes %v and %v", a, b)
	}
	shape = make([]int, len(a.stored))
	for i := range shape {
		shape[i] = 1
	}
	dims = make([][]int, b.rank())
	where := map[int]int{} // b's stored axis -> a's
	for d := range a.dims {
		switch {
		case b.dim(d) == a.dim(d):
			ba, aa := dropOnes(b, b.dims[d]), dropOnes(a, a.dims[d])
			if len(ba) != len(aa) {
				return nil, nil, nil, fmt.Errorf("axis %d of %v and %v is stored differently", d, a, b)
			}
			for j, x := range aa {
				y := ba[j]
				if (x == 0) != (y == 0) || x != 0 && a.axisSize(x) != b.axisSize(y) {
					return nil, nil, nil, fmt.Errorf("axis %d of %v and %v is stored differently", d, a, b)
				}
				if x != 0 {
					where[y] = x
				}
			}
			dims[d] = slices.Clone(a.dims[d])
		case b.dim(d) == sym{c: 1}:
			dims[d] = []int{}
		default:
			return nil, nil, nil, fmt.Errorf("shapes %v and %v do not broadcast", a, b)
		}
	}
	for x := 1; x <= len(a.stored); x++ {
		for y, w := range where {
			if w == x {
				order = append(order, y)
				shape[x-1] = a.axisSize(x)
			}
		}
	}
	// b's other stored axes are of size 1: they go last and are dropped.
	for y := 1; y <= len(b.stored); y++ {
		if _, ok := where[y]; !ok {
			if b.axisSize(y) != 1 {
				return nil, nil, nil, fmt.Errorf("shapes %v and %v", a, b)
			}
			order = append(order, y)
		}
	}
	return order, shape, dims, nil
}

// dropOnes is the stored axes as without those of size 1.
func dropOnes(v *value, as []int) []int {
	var out []int
	for _, a := range as {
		if a == 0 || v.axisSize(a) != 1 {
			out = append(out, a)
		}
	}
	return out
}
