package nn

import (
	"fmt"
	"math"
	"slices"
)

// axisSplit views a per-sample shape around axis a: the elements before it
// (per sample), its size and the elements after it.
func axisSplit(shape []int, a int) (outer, size, inner int) {
	return Size(shape[:a]), shape[a], Size(shape[a+1:])
}

// Take gathers, along per-sample axis Axis (0 is the first per-sample
// axis), the constant indices Index (each in [0, size)): the output's
// Axis dimension is len(Index). Backward adds each output gradient back to
// its index, duplicate indices in index order.
type Take struct {
	Axis  int
	Index []int

	outer, size, inner int // per-sample split of the input at Axis
	out                []int
}

func (l *Take) Kind() string     { return "take" }
func (l *Take) Params() []*Param { return nil }

func (l *Take) Build(in [][]int) ([]int, error) {
	if len(in) != 1 {
		return nil, fmt.Errorf("takes one input, got %d", len(in))
	}
	if l.Axis < 0 || l.Axis >= len(in[0]) {
		return nil, fmt.Errorf("axis %d is outside input %v", l.Axis, in[0])
	}
	if len(l.Index) == 0 {
		return nil, fmt.Errorf("no indices")
	}
	l.outer, l.size, l.inner = axisSplit(in[0], l.Axis)
	for _, i := range l.Index {
		if i < 0 || i >= l.size {
			return nil, fmt.Errorf("index %d is outside [0, %d)", i, l.size)
		}
	}
	l.out = append([]int(nil), in[0]...)
	l.out[l.Axis] = len(l.Index)
	return append([]int(nil), l.out...), nil
}

func (l *Take) Forward(c *Ctx, s *Slot, in []*Tensor) *Tensor {
	n := Rows(in[0])
	y := s.Buf(0, s.withBatch(n, l.out)...)
	x, yd := F32(in[0]), F32(y)
	idx, size, inner, k := l.Index, l.size, l.inner, len(l.Index)
	rows := n * l.outer
	parallel(threadsOf(c), rows, max(1, cheapGrain/(k*inner)), func(lo, hi int) {
		for r := lo; r < hi; r++ {
			xs, ys := x[r*size*inner:(r+1)*size*inner], yd[r*k*inner:(r+1)*k*inner]
			if inner == 1 {
				ys = ys[:len(idx)]
				for j, i := range idx {
					ys[j] = xs[i]
				}
				continue
			}
			for j, i := range idx {
				copy(ys[j*inner:(j+1)*inner], xs[i*inner:(i+1)*inner])
			}
		}
	})
	return y
}

// Backward scatters dout back. Threads take disjoint outer rows (or, with
// fewer rows than threads, column chunks of the inner elements), each
// adding in index order.
func (l *Take) Backward(c *Ctx, s *Slot, in []*Tensor, out, dout *Tensor, need []bool) []*Tensor {
	g := s.Grads(1)
	if !need[0] {
		return g
	}
	dx := s.ZeroBuf(1, in[0].Shape()...)
	d, dy := F32(dx), F32(dout)
	idx, size, inner, k := l.Index, l.size, l.inner, len(l.Index)
	rows := Rows(in[0]) * l.outer
	threads := threadsOf(c)
	chunks := 1
	if rows < threads {
		chunks = max(1, min(threads, inner/256))
	}
	parallel(threads, rows*chunks, max(1, cheapGrain/(k*inner/chunks+1)), func(lo, hi int) {
		for it := lo; it < hi; it++ {
			r, cj := it/chunks, it%chunks
			jlo, jhi := cj*inner/chunks, (cj+1)*inner/chunks
			ds, dys := d[r*size*inner:(r+1)*size*inner], dy[r*k*inner:(r+1)*k*inner]
			if inner == 1 {
				dys = dys[:len(idx)]
				for j, i := range idx {
					ds[i] += dys[j]
				}
				continue
			}
			for j, i := range idx {
				dst, src := ds[i*inner+jlo:i*inner+jhi], dys[j*inner+jlo:j*inner+jhi]
				for t, v := range src {
					dst[t] += v
				}
			}
		}
	})
	g[0] = dx
	return g
}

// Pad pads per-sample axis Axis (0 is the first per-sample axis) with
// Before and After elements of the constant Value, or with Mode "reflect"
// the elements mirrored about the edge (not repeating it), or with "edge"
// copies of the edge element. Backward passes the interior's gradient and
// adds each padded element's into the element it copies, in order.
type Pad struct {
	Axis, Before, After int
	Value               float32
	Mode                string

	outer, size, inner int
	out                []int
}

func (l *Pad) Kind() string     { return "pad" }
func (l *Pad) Params() []*Param { return nil }

func (l *Pad) Build(in [][]int) ([]int, error) {
	if len(in) != 1 {
		return nil, fmt.Errorf("takes one input, got %d", len(in))
	}
	if l.Axis < 0 || l.Axis >= len(in[0]) {
		return nil, fmt.Errorf("axis %d is outside input %v", l.Axis, in[0])
	}
	if l.Before < 0 || l.After < 0 {
		return nil, fmt.Errorf("negative padding %d, %d", l.Before, l.After)
	}
	l.outer, l.size, l.inner = axisSplit(in[0], l.Axis)
	switch l.Mode {
	case "", "constant":
	case "reflect":
		if l.Before >= l.size || l.After >= l.size {
			return nil, fmt.Errorf("reflect padding %d, %d of an axis of %d (each must be less)", l.Before, l.After, l.size)
		}
	case "edge":
		if l.size == 0 {
			return nil, fmt.Errorf("edge padding of an empty axis")
		}
	default:
		return nil, fmt.Errorf("padding mode %q (want constant, reflect or edge)", l.Mode)
	}
	l.out = append([]int(nil), in[0]...)
	l.out[l.Axis] += l.Before + l.After
	return append([]int(nil), l.out...), nil
}

func (l *Pad) Forward(c *Ctx, s *Slot, in []*Tensor) *Tensor {
	n := Rows(in[0])
	y := s.Buf(0, s.withBatch(n, l.out)...)
	x, yd := F32(in[0]), F32(y)
	w, inner := l.size*l.inner, l.inner
	wo := w + (l.Before+l.After)*inner
	pre := l.Before * inner
	v := l.Value
	parallel(threadsOf(c), n*l.outer, max(1, cheapGrain/wo), func(lo, hi int) {
		for r := lo; r < hi; r++ {
			ys, xs := yd[r*wo:(r+1)*wo], x[r*w:(r+1)*w]
			copy(ys[pre:pre+w], xs)
			l.padded(func(p int) {
				dst := ys[(p+l.Before)*inner : (p+l.Before+1)*inner]
				if k := l.source(p); k >= 0 {
					copy(dst, xs[k*inner:(k+1)*inner])
				} else {
					for j := range dst {
						dst[j] = v
					}
				}
			})
		}
	})
	return y
}

// padded calls f with each padded position of the axis in order: those
// before it (< 0), then those after it (>= size).
func (l *Pad) padded(f func(p int)) {
	for p := -l.Before; p < 0; p++ {
		f(p)
	}
	for p := l.size; p < l.size+l.After; p++ {
		f(p)
	}
}

// source is the element of the axis that padded position p (< 0 before
// it, >= size after it) copies, -1 for the constant.
func (l *Pad) source(p int) int {
	switch l.Mode {
	case "reflect":
		if p < 0 {
			return -p
		}
		return 2*(l.size-1) - p
	case "edge":
		return min(max(p, 0), l.size-1)
	}
	return -1
}

func (l *Pad) Backward(c *Ctx, s *Slot, in []*Tensor, out, dout *Tensor, need []bool) []*Tensor {
	g := s.Grads(1)
	if !need[0] {
		return g
	}
	dx := s.Buf(1, in[0].Shape()...)
	d, dy := F32(dx), F32(dout)
	w := l.size * l.inner
	wo := w + (l.Before+l.After)*l.inner
	pre := l.Before * l.inner
	inner := l.inner
	parallel(threadsOf(c), Rows(dx)*l.outer, max(1, cheapGrain/wo), func(lo, hi int) {
		for r := lo; r < hi; r++ {
			ds, dys := d[r*w:(r+1)*w], dy[r*wo:(r+1)*wo]
			copy(ds, dys[pre:pre+w])
			l.padded(func(p int) {
				if k := l.source(p); k >= 0 {
					for j, v := range dys[(p+l.Before)*inner : (p+l.Before+1)*inner] {
						ds[k*inner+j] += v
					}
				}
			})
		}
	})
	g[0] = dx
	return g
}

// Reduce is the "sum", "mean", "max", "min" or "l2" (the Euclidean norm) of
// the last per-sample axis, kept with size 1: each row summed (squared) in
// float64 in row order and rounded once, or its largest (smallest) value,
// whose gradient is shared evenly by the values equal to it (PyTorch's amax
// and amin). The norm's gradient is dy·x/y, 0 where the norm is 0 (as
// PyTorch's). "argmax" is the position of the row's first largest value
// (a NaN the largest, as PyTorch's), which has no gradient.
type Reduce struct {
	Op string

	d int
}

func (l *Reduce) Kind() string     { return "reduce" }
func (l *Reduce) Params() []*Param { return nil }

func (l *Reduce) Build(in [][]int) ([]int, error) {
	if !slices.Contains([]string{"sum", "mean", "max", "min", "l2", "argmax"}, l.Op) {
		return nil, fmt.Errorf("unknown reduction %q (want sum, mean, max, min, l2 or argmax)", l.Op)
	}
	out, err := rowInput(in)
	if err != nil {
		return nil, err
	}
	l.d = out[len(out)-1]
	out[len(out)-1] = 1
	return out, nil
}

func (l *Reduce) Forward(c *Ctx, s *Slot, in []*Tensor) *Tensor {
	x := F32(in[0])
	y := s.Buf(0, s.shape(in[0].Shape(), 1)...)
	yd, d := F32(y), l.d
	eachRow(c, len(yd), d, func(r int) { yd[r] = l.row(x[r*d : (r+1)*d]) })
	return y
}

// row reduces one row.
func (l *Reduce) row(xs []float32) float32 {
	switch l.Op {
	case "argmax":
		at := 0
		for j, v := range xs {
			if m := xs[at]; m == m && (v > m || v != v) {
				at = j
			}
		}
		return float32(at)
	case "max", "min":
		isMax, m := l.Op == "max", xs[0]
		for _, v := range xs {
			if v != v { // a NaN wins, as in PyTorch
				return v
			}
			if isMax && v > m || !isMax && v < m {
				m = v
			}
		}
		return m
	case "l2":
		var sum float64
		for _, v := range xs {
			sum += float64(v) * float64(v)
		}
		return float32(math.Sqrt(sum))
	}
	var sum float64
	for _, v := range xs {
		sum += float64(v)
	}
	if l.Op == "mean" {
		sum /= float64(len(xs))
	}
	return float32(sum)
}

// Backward spreads each row's gradient over the row: dout, or dout/D for
// the mean (one float32 division, as PyTorch's), dout shared by the values
// equal to the max or min, dout·x/y for the norm.
func (l *Reduce) Backward(c *Ctx, s *Slot, in []*Tensor, out, dout *Tensor, need []bool) []*Tensor {
	g := s.Grads(1)
	if !need[0] || l.Op == "argmax" {
		return g
	}
	dx := s.Buf(1, in[0].Shape()...)
	d, dy, x, y, w := F32(dx), F32(dout), F32(in[0]), F32(out), l.d
	parallel(threadsOf(c), len(dy), max(1, cheapGrain/w), func(lo, hi int) {
		for r := lo; r < hi; r++ {
			l.gradRow(d[r*w:(r+1)*w], x[r*w:(r+1)*w], y[r], dy[r])
		}
	})
	g[0] = dx
	return g
}

// gradRow writes the gradient of one row, xs, whose reduction is y, from
// the reduction's gradient v.
func (l *Reduce) gradRow(row, xs []float32, y, v float32) {
	switch l.Op {
	case "max", "min":
		ties := 0
		for _, x := range xs {
			if x == y {
				ties++
			}
		}
		v /= float32(max(ties, 1))
		for j, x := range xs {
			row[j] = 0
			if x == y {
				row[j] = v
			}
		}
		return
	case "l2":
		for j, x := range xs {
			row[j] = 0
			if y != 0 {
				row[j] = float32(float64(v) * float64(x) / float64(y))
			}
		}
		return
	case "mean":
		v /= float32(len(xs))
	}
	for j := range row {
		row[j] = v
	}
}

// Pick takes of each sample the row of its first axis that its second
// input names: y[n] = x[n, i[n]], x [N, T, ...] and i [N] of whole numbers
// (x[torch.arange(N), i], as a classifier pools at each sequence's last
// token; a negative i counts from the end). Backward adds dy into those
// rows; the index gets no gradient.
type Pick struct {
	rows, inner int
}

// IntInput reports that input 1 takes integers in [0, rows) (so that a
// profile feeds it such).
func (l *Pick) IntInput(i int) (limit int, ok bool) { return l.rows, i == 1 }

func (l *Pick) Kind() string     { return "pick" }
func (l *Pick) Params() []*Param { return nil }

func (l *Pick) Build(in [][]int) ([]int, error) {
	if len(in) != 2 || len(in[0]) < 1 || Size(in[1]) != 1 {
		return nil, fmt.Errorf("takes a tensor of rows and one index a sample, got %v", in)
	}
	l.rows, l.inner = in[0][0], Size(in[0][1:])
	return slices.Clone(in[0][1:]), nil
}

// row is sample n's row, from its index v.
func (l *Pick) row(v float32) int {
	r := int(v)
	if float32(r) != v || r < -l.rows || r >= l.rows {
		panic(fmt.Sprintf("nn: pick: index %v is not an integer in [%d, %d)", v, -l.rows, l.rows))
	}
	if r < 0 {
		r += l.rows
	}
	return r
}

func (l *Pick) Forward(c *Ctx, s *Slot, in []*Tensor) *Tensor {
	x, idx := F32(in[0]), F32(in[1])
	n := Rows(in[0])
	y := s.Buf(0, s.withBatch(n, in[0].Shape()[2:])...)
	yd, w := F32(y), l.inner
	for k := range n {
		r := l.row(idx[k])
		copy(yd[k*w:(k+1)*w], x[(k*l.rows+r)*w:(k*l.rows+r+1)*w])
	}
	return y
}

func (l *Pick) Backward(c *Ctx, s *Slot, in []*Tensor, out, dout *Tensor, need []bool) []*Tensor {
	g := s.Grads(2)
	if !need[0] {
		return g
	}
	dx := s.ZeroBuf(1, in[0].Shape()...)
	d, dy, idx, w := F32(dx), F32(dout), F32(in[1]), l.inner
	for k := range Rows(in[0]) {
		r := l.row(idx[k])
		copy(d[(k*l.rows+r)*w:(k*l.rows+r+1)*w], dy[k*w:(k+1)*w])
	}
	g[0] = dx
	return g
}

// Compare is y = 1 where x Op C holds, else 0, Op "eq", "ne", "lt", "gt",
// "le" or "ge" (NaN compares unequal to everything). It has no gradient.
type Compare struct {
	Op string
	C  float32
}

func (l *Compare) Kind() string     { return "compare" }
func (l *Compare) Params() []*Param { return nil }

func (l *Compare) Build(in [][]int) ([]int, error) {
	switch l.Op {
	case "eq", "ne", "lt", "gt", "le", "ge":
	default:
		return nil, fmt.Errorf("unknown comparison %q (want eq, ne, lt, gt, le or ge)", l.Op)
	}
	return oneInput(in)
}

func (l *Compare) Forward(c *Ctx, s *Slot, in []*Tensor) *Tensor {
	k, op := l.C, l.Op
	return unaryForward(c, s, in[0], cheapGrain, func(y, x, _ []float32) {
		y = y[:len(x)]
		switch op {
		case "eq":
			for i, v := range x {
				y[i] = b2f(v == k)
			}
		case "ne":
			for i, v := range x {
				y[i] = b2f(v != k)
			}
		case "lt":
			for i, v := range x {
				y[i] = b2f(v < k)
			}
		case "gt":
			for i, v := range x {
				y[i] = b2f(v > k)
			}
		case "le":
			for i, v := range x {
				y[i] = b2f(v <= k)
			}
		case "ge":
			for i, v := range x {
				y[i] = b2f(v >= k)
			}
		}
	})
}

// b2f is 1 for true and 0 for false (inlined).
func b2f(t bool) float32 {
	if t {
		return 1
	}
	return 0
}

// Backward returns no gradient: the output is piecewise constant.
func (l *Compare) Backward(c *Ctx, s *Slot, in []*Tensor, out, dout *Tensor, need []bool) []*Tensor {
	return s.Grads(1)
}

// Truncate is y = trunc(x), rounding toward zero (a Cast from float to an
// integer type, the result kept as float32). It has no gradient.
type Truncate struct{}

func (Truncate) Kind() string                    { return "truncate" }
func (Truncate) Params() []*Param                { return nil }
func (Truncate) Build(in [][]int) ([]int, error) { return oneInput(in) }

func (Truncate) Forward(c *Ctx, s *Slot, in []*Tensor) *Tensor {
	return unaryForward(c, s, in[0], cheapGrain, func(y, x, _ []float32) {
		y = y[:len(x)]
		for i, v := range x {
			y[i] = float32(math.Trunc(float64(v)))
		}
	})
}

// Backward returns no gradient: the output is piecewise constant.
func (Truncate) Backward(c *Ctx, s *Slot, in []*Tensor, out, dout *Tensor, need []bool) []*Tensor {
	return s.Grads(1)
}
