package onnx

import (
	"fmt"
	"math"
	"slices"
)

// kind is the element type of a constant.
type kind uint8

const (
	kFloat kind = iota
	kInt
	kBool
)

func (k kind) String() string {
	return [...]string{"float", "integer", "bool"}[k]
}

// sym is an integer of shape arithmetic: c, or c times the batch size when
// n is set (the batch size is not known when the graph is built).
type sym struct {
	c int64
	n bool
}

func (s sym) String() string {
	switch {
	case !s.n:
		return fmt.Sprint(s.c)
	case s.c == 1:
		return "N"
	}
	return fmt.Sprintf("%d·N", s.c)
}

// maxConst bounds the elements of a constant the importer computes (an
// Expand or ConstantOfShape of a shape the file claims).
const maxConst = 1 << 24

// konst is a tensor known when the graph is built: an initializer, a
// Constant's value, or what operators compute from them, shapes included.
//
// A konst derived from initializers by operators that only move elements
// (Transpose, Slice, Gather, Reshape, Concat, Expand, ...) remembers where
// each element came from (src), so that a layer taking it as a weight can
// train the initializer itself. A konst may vary along no axis but one of
// batch size (an Expand to the batch, a ConstantOfShape of a shape that
// holds it): that axis is kept with size 1.
type konst struct {
	shape []int
	batch int // the axis of batch size, -1 for none
	kind  kind
	f     []float32 // kFloat
	i     []sym     // kInt and kBool (0 or 1)
	// src[e] is the initializer element that element e is (init<<32 |
	// flat index, with bufferBit set for a buffer's), or -1 for an element
	// that is no initializer's; nil when no element is.
	src []int64
}

// bufferBit marks, in a konst's src, the elements of an initializer the
// file calls a buffer: they are traced like weights' but never trained.
const bufferBit = 1 << 31

func (k *konst) size() int {
	if k.kind == kFloat {
		return len(k.f)
	}
	return len(k.i)
}

// ints returns an integer constant's values (whole floats converted); not
// for one that holds the batch size.
func (k *konst) ints() ([]int64, bool) {
	out := make([]int64, k.size())
	for j := range out {
		if k.kind == kFloat {
			v := k.f[j]
			if v != float32(int64(v)) {
				return nil, false
			}
			out[j] = int64(v)
			continue
		}
		if k.i[j].n {
			return nil, false
		}
		out[j] = k.i[j].c
	}
	return out, true
}

// syms returns an integer constant's values as shape arithmetic.
func (k *konst) syms() ([]sym, bool) {
	if k.kind != kFloat {
		return k.i, true
	}
	v, ok := k.ints()
	if !ok {
		return nil, false
	}
	out := make([]sym, len(v))
	for j, x := range v {
		out[j] = sym{c: x}
	}
	return out, true
}

// floats returns the values as floats; false if one holds the batch size.
func (k *konst) floats() ([]float32, bool) {
	if k.kind == kFloat {
		return k.f, true
	}
	out := make([]float32, len(k.i))
	for j, v := range k.i {
		if v.n {
			return nil, false
		}
		out[j] = float32(v.c)
	}
	return out, true
}

// scalar returns a one-element constant's value.
func (k *konst) scalar() (float32, bool) {
	if k.size() != 1 || k.batch >= 0 {
		return 0, false
	}
	f, ok := k.floats()
	if !ok {
		return 0, false
	}
	return f[0], true
}

// trainable reports whether some element comes from an initializer that
// is not a buffer.
func (k *konst) trainable() bool {
	if k.kind != kFloat {
		return false
	}
	for _, s := range k.src {
		if s >= 0 && s&bufferBit == 0 {
			return true
		}
	}
	return false
}

func newFloat(shape []int, f []float32) *konst {
	return &konst{shape: shape, batch: -1, kind: kFloat, f: f}
}

func newInts(shape []int, v ...int64) *konst {
	k := &konst{shape: shape, batch: -1, kind: kInt, i: make([]sym, len(v))}
	for j, x := range v {
		k.i[j] = sym{c: x}
	}
	return k
}

func newSyms(shape []int, v []sym) *konst {
	return &konst{shape: shape, batch: -1, kind: kInt, i: v}
}

// strides are the row-major strides of shape.
func strides(shape []int) []int {
	s := make([]int, len(shape))
	n := 1
	for a := len(shape) - 1; a >= 0; a-- {
		s[a] = n
		n *= shape[a]
	}
	return s
}

// checkSize refuses a shape of more than maxConst elements or a negative
// dimension.
func checkSize(shape []int) error {
	n := 1
	for _, d := range shape {
		if d < 0 {
			return fmt.Errorf("shape %v has a negative dimension", shape)
		}
		if n = satMul(n, d); n > maxConst {
			return fmt.Errorf("a constant of shape %v is over %d elements", shape, maxConst)
		}
	}
	return nil
}

// pick makes the konst of the given shape whose element e is k's element
// from[e] (-1: a zero that no initializer holds).
func (k *konst) pick(shape []int, batch int, from []int) *konst {
	out := &konst{shape: shape, batch: batch, kind: k.kind}
	switch k.kind {
	case kFloat:
		out.f = make([]float32, len(from))
		for e, j := range from {
			if j >= 0 {
				out.f[e] = k.f[j]
			}
		}
	default:
		out.i = make([]sym, len(from))
		for e, j := range from {
			if j >= 0 {
				out.i[e] = k.i[j]
			}
		}
	}
	if k.src != nil {
		out.src = make([]int64, len(from))
		for e, j := range from {
			out.src[e] = -1
			if j >= 0 {
				out.src[e] = k.src[j]
			}
		}
	}
	return out
}

// clone is a copy of k whose elements may be changed.
func (k *konst) clone() *konst {
	out := *k
	out.shape = slices.Clone(k.shape)
	out.f, out.i, out.src = slices.Clone(k.f), slices.Clone(k.i), slices.Clone(k.src)
	return &out
}

// each calls fn with every multi-index of shape in row-major order and its
// flat position.
func each(shape []int, fn func(idx []int, e int)) {
	n := 1
	for _, d := range shape {
		n *= d
	}
	idx := make([]int, len(shape))
	for e := 0; e < n; e++ {
		fn(idx, e)
		for a := len(shape) - 1; a >= 0; a-- {
			if idx[a]++; idx[a] < shape[a] {
				break
			}
			idx[a] = 0
		}
	}
}

// normAxis resolves an ONNX axis (negative from the end) of a rank-r tensor.
func normAxis(a int64, r int) (int, error) {
	if a < 0 {
		a += int64(r)
	}
	if a < 0 || a >= int64(r) {
		return 0, fmt.Errorf("axis %d of a tensor of %d dimensions", a, r)
	}
	return int(a), nil
}

func (k *konst) transpose(perm []int) (*konst, error) {
	r := len(k.shape)
	if len(perm) == 0 {
		for a := r - 1; a >= 0; a-- {
			perm = append(perm, a)
		}
	}
	if !isPerm(perm, r) {
		return nil, fmt.Errorf("perm %v of a tensor of %d dimensions", perm, r)
	}
	shape := make([]int, r)
	batch := -1
	for a, p := range perm {
		shape[a] = k.shape[p]
		if p == k.batch {
			batch = a
		}
	}
	st := strides(k.shape)
	from := make([]int, k.size())
	each(shape, func(idx []int, e int) {
		j := 0
		for a, p := range perm {
			j += idx[a] * st[p]
		}
		from[e] = j
	})
	return k.pick(shape, batch, from), nil
}

func isPerm(p []int, r int) bool {
	if len(p) != r {
		return false
	}
	seen := make([]bool, r)
	for _, a := range p {
		if a < 0 || a >= r || seen[a] {
			return false
		}
		seen[a] = true
	}
	return true
}

// reshape gives k the shape (already resolved: no 0 or -1). A konst of
// batch size reshapes only where that axis stays apart.
func (k *konst) reshape(shape []int) (*konst, error) {
	if nn := prod(shape); nn != k.size() {
		return nil, fmt.Errorf("shape %v for %d elements", shape, k.size())
	}
	if k.batch >= 0 {
		return nil, fmt.Errorf("a reshape of a constant that varies with the batch")
	}
	out := *k
	out.shape = slices.Clone(shape)
	return &out, nil
}

func prod(shape []int) int {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return n
}

// slice takes [start, end) by step along each of axes.
func (k *konst) slice(starts, ends, axes, steps []int64) (*konst, error) {
	r := len(k.shape)
	lo, step := make([]int, r), make([]int, r)
	shape := slices.Clone(k.shape)
	for a := range step {
		step[a] = 1
	}
	for j, s := range starts {
		ax := int64(j)
		if axes != nil {
			ax = axes[j]
		}
		a, err := normAxis(ax, r)
		if err != nil {
			return nil, err
		}
		st := int64(1)
		if steps != nil {
			st = steps[j]
		}
		if a == k.batch {
			return nil, fmt.Errorf("a slice along the batch")
		}
		first, n, err := sliceRange(s, ends[j], st, k.shape[a])
		if err != nil {
			return nil, err
		}
		lo[a], step[a], shape[a] = first, int(st), n
	}
	strd := strides(k.shape)
	from := make([]int, prod(shape))
	each(shape, func(idx []int, e int) {
		j := 0
		for a, i := range idx {
			j += (lo[a] + i*step[a]) * strd[a]
		}
		from[e] = j
	})
	return k.pick(shape, k.batch, from), nil
}

// sliceRange resolves an ONNX slice of an axis of n elements (negative
// bounds from the end, clamped as ONNX says for each direction) to its first
// index and element count.
func sliceRange(start, end, step int64, n int) (first, count int, err error) {
	if step == 0 {
		return 0, 0, fmt.Errorf("slice step 0")
	}
	N := int64(n)
	fix := func(v int64, lo, hi int64) int64 {
		if v < 0 {
			v += N
		}
		return max(lo, min(v, hi))
	}
	var s, e int64
	if step > 0 {
		s, e = fix(start, 0, N), fix(end, 0, N)
		if e <= s {
			return int(s), 0, nil
		}
		return int(s), int((e - s + step - 1) / step), nil
	}
	s, e = fix(start, 0, N-1), fix(end, -1, N-1)
	if end < -N { // ends below the start of the axis mean "to the first element"
		e = -1
	}
	if s <= e {
		return int(s), 0, nil
	}
	return int(s), int((s - e - step - 1) / -step), nil
}

// gather takes the elements at indices along axis.
func (k *konst) gather(indices *konst, axis int) (*konst, error) {
	r := len(k.shape)
	if axis == k.batch || indices.batch >= 0 {
		return nil, fmt.Errorf("a gather along the batch")
	}
	is, ok := indices.ints()
	if !ok {
		return nil, fmt.Errorf("indices are not integers")
	}
	n := k.shape[axis]
	for j, v := range is {
		if v < 0 {
			v += int64(n)
		}
		if v < 0 || v >= int64(n) {
			return nil, fmt.Errorf("index %d of an axis of %d", is[j], n)
		}
		is[j] = v
	}
	shape := slices.Concat(k.shape[:axis], indices.shape, k.shape[axis+1:])
	if err := checkSize(shape); err != nil {
		return nil, err
	}
	batch := k.batch
	if batch > axis {
		batch += len(indices.shape) - 1
	}
	st := strides(k.shape)
	q := len(indices.shape)
	from := make([]int, prod(shape))
	each(shape, func(idx []int, e int) {
		j := 0
		for a := 0; a < axis; a++ {
			j += idx[a] * st[a]
		}
		flat := 0
		for a := 0; a < q; a++ {
			flat = flat*indices.shape[a] + idx[axis+a]
		}
		j += int(is[flat]) * st[axis]
		for a := axis + 1; a < r; a++ {
			j += idx[a-1+q] * st[a]
		}
		from[e] = j
	})
	return k.pick(shape, batch, from), nil
}

// concat joins konsts of one kind along axis.
func concatK(ks []*konst, axis int) (*konst, error) {
	r := len(ks[0].shape)
	shape := slices.Clone(ks[0].shape)
	shape[axis] = 0
	var src bool
	for _, k := range ks {
		if len(k.shape) != r || k.batch >= 0 {
			return nil, fmt.Errorf("concatenation of constants of shapes %v and %v", ks[0].shape, k.shape)
		}
		for a := range shape {
			if a != axis && k.shape[a] != shape[a] {
				return nil, fmt.Errorf("concatenation of constants of shapes %v and %v", ks[0].shape, k.shape)
			}
		}
		shape[axis] += k.shape[axis]
		src = src || k.src != nil
	}
	kd := ks[0].kind
	for _, k := range ks {
		if (k.kind == kFloat) != (kd == kFloat) {
			return nil, fmt.Errorf("concatenation of %s and %s constants", kd, k.kind)
		}
	}
	out := &konst{shape: shape, batch: -1, kind: kd}
	n := prod(shape)
	if kd == kFloat {
		out.f = make([]float32, 0, n)
	} else {
		out.i = make([]sym, 0, n)
	}
	if src {
		out.src = make([]int64, 0, n)
	}
	outer := prod(shape[:axis])
	for o := 0; o < outer; o++ {
		for _, k := range ks {
			w := prod(k.shape[axis:])
			if kd == kFloat {
				out.f = append(out.f, k.f[o*w:(o+1)*w]...)
			} else {
				out.i = append(out.i, k.i[o*w:(o+1)*w]...)
			}
			if src {
				for j := o * w; j < (o+1)*w; j++ {
					s := int64(-1)
					if k.src != nil {
						s = k.src[j]
					}
					out.src = append(out.src, s)
				}
			}
		}
	}
	return out, nil
}

// expand broadcasts k to shape (ONNX Expand: numpy rules, the result of
// the larger rank); a dimension of batch size becomes k's batch axis.
// scatterND is ONNX's ScatterND without reduction: k with the slices that
// indices [..., q] name replaced by updates [..., k.shape[q:]...].
func (k *konst) scatterND(indices, updates *konst) (*konst, error) {
	is, ok := indices.ints()
	if !ok || len(indices.shape) == 0 || indices.batch >= 0 {
		return nil, fmt.Errorf("indices are not integers of fixed shape")
	}
	q := indices.shape[len(indices.shape)-1]
	if q < 1 || q > len(k.shape) {
		return nil, fmt.Errorf("indices of %d axes into a tensor of %d", q, len(k.shape))
	}
	if k.batch >= 0 || updates.batch >= 0 {
		return nil, fmt.Errorf("a scatter into a tensor of the batch's size")
	}
	if k.kind != updates.kind {
		return nil, fmt.Errorf("updates of another type than the data")
	}
	want := slices.Concat(indices.shape[:len(indices.shape)-1], k.shape[q:])
	if !slices.Equal(updates.shape, want) {
		return nil, fmt.Errorf("updates of shape %v, want %v", updates.shape, want)
	}
	inner := prod(k.shape[q:])
	st := strides(k.shape)
	out := k.clone()
	if out.src == nil && updates.src != nil {
		out.src = slices.Repeat([]int64{-1}, k.size())
	}
	for t := 0; t < len(is)/q; t++ {
		at := 0
		for a, v := range is[t*q : (t+1)*q] {
			if v < 0 {
				v += int64(k.shape[a])
			}
			if v < 0 || v >= int64(k.shape[a]) {
				return nil, fmt.Errorf("index %d of an axis of %d", is[t*q+a], k.shape[a])
			}
			at += int(v) * st[a]
		}
		for j := range inner {
			u := t*inner + j
			if k.kind == kFloat {
				out.f[at+j] = updates.f[u]
			} else {
				out.i[at+j] = updates.i[u]
			}
			if out.src != nil {
				out.src[at+j] = -1
				if updates.src != nil {
					out.src[at+j] = updates.src[u]
				}
			}
		}
	}
	return out, nil
}

func (k *konst) expand(target []sym) (*konst, error) {
	r := max(len(k.shape), len(target))
	shape := make([]int, r)
	batch := -1
	for a := 0; a < r; a++ {
		d, t := 1, sym{c: 1}
		if j := a - (r - len(k.shape)); j >= 0 {
			d = k.shape[j]
			if j == k.batch {
				t = sym{c: 1, n: true}
			}
		}
		if j := a - (r - len(target)); j >= 0 && !(target[j] == sym{c: 1}) {
			if t.n && target[j] != t {
				return nil, fmt.Errorf("expand of %v to %v", k.shape, target)
			}
			t = target[j]
		}
		switch {
		case t.n:
			if t.c != 1 || d != 1 {
				return nil, fmt.Errorf("expand of %v to %v", k.shape, target)
			}
			batch, shape[a] = a, 1
		case d == 1:
			if t.c < 1 {
				return nil, fmt.Errorf("expand of %v to %v", k.shape, target)
			}
			shape[a] = int(min(t.c, math.MaxInt32))
		case int64(d) == t.c || t.c == 1:
			shape[a] = d
		default:
			return nil, fmt.Errorf("expand of %v to %v", k.shape, target)
		}
	}
	return k.broadcastTo(shape, batch)
}

// broadcastTo repeats k along the axes where it has size 1 (numpy rules,
// aligned at the last axis).
func (k *konst) broadcastTo(shape []int, batch int) (*konst, error) {
	if err := checkSize(shape); err != nil {
		return nil, err
	}
	off := len(shape) - len(k.shape)
	st := strides(k.shape)
	from := make([]int, prod(shape))
	each(shape, func(idx []int, e int) {
		j := 0
		for a := range k.shape {
			if k.shape[a] != 1 {
				j += idx[a+off] * st[a]
			}
		}
		from[e] = j
	})
	return k.pick(shape, batch, from), nil
}

// broadcastShapes is numpy's broadcast of two shapes; the batch axis (of
// the result) is kept from either.
func broadcastShapes(a, b *konst) ([]int, int, error) {
	r := max(len(a.shape), len(b.shape))
	shape := make([]int, r)
	batch := -1
	for x := 0; x < r; x++ {
		da, db := 1, 1
		if j := x - (r - len(a.shape)); j >= 0 {
			da = a.shape[j]
			if j == a.batch {
				batch = x
			}
		}
		if j := x - (r - len(b.shape)); j >= 0 {
			db = b.shape[j]
			if j == b.batch {
				batch = x
			}
		}
		switch {
		case da == db || db == 1:
			shape[x] = da
		case da == 1:
			shape[x] = db
		default:
			return nil, 0, fmt.Errorf("shapes %v and %v do not broadcast", a.shape, b.shape)
		}
	}
	return shape, batch, checkSize(shape)
}

// binary computes op elementwise (numpy broadcasting) of two constants:
// floats if either is float, else shape arithmetic on syms. Initializer
// origins do not survive arithmetic.
func binaryK(op string, a, b *konst) (*konst, error) {
	shape, batch, err := broadcastShapes(a, b)
	if err != nil {
		return nil, err
	}
	if a, err = a.broadcastTo(shape, batch); err != nil {
		return nil, err
	}
	if b, err = b.broadcastTo(shape, batch); err != nil {
		return nil, err
	}
	n := prod(shape)
	cmp := op == "eq" || op == "lt" || op == "gt" || op == "and" || op == "or" || op == "xor"
	if a.kind == kFloat || b.kind == kFloat {
		fa, ok1 := a.floats()
		fb, ok2 := b.floats()
		if !ok1 || !ok2 {
			return nil, fmt.Errorf("%s of the batch size and a float", op)
		}
		out := &konst{shape: shape, batch: batch, kind: kFloat}
		if cmp {
			out.kind, out.i = kBool, make([]sym, n)
		} else {
			out.f = make([]float32, n)
		}
		for e := 0; e < n; e++ {
			x, y := fa[e], fb[e]
			var v float32
			var t bool
			switch op {
			case "add":
				v = x + y
			case "sub":
				v = x - y
			case "mul":
				v = x * y
			case "div":
				v = x / y
			case "pow":
				v = float32(math.Pow(float64(x), float64(y)))
			case "min":
				v = min(x, y)
			case "max":
				v = max(x, y)
			case "eq":
				t = x == y
			case "lt":
				t = x < y
			case "gt":
				t = x > y
			default:
				return nil, fmt.Errorf("%s of float constants", op)
			}
			if cmp {
				out.i[e] = boolSym(t)
			} else {
				out.f[e] = v
			}
		}
		return out, nil
	}
	out := &konst{shape: shape, batch: batch, kind: kInt, i: make([]sym, n)}
	if cmp {
		out.kind = kBool
	}
	for e := 0; e < n; e++ {
		v, err := symOp(op, a.i[e], b.i[e])
		if err != nil {
			return nil, err
		}
		out.i[e] = v
	}
	return out, nil
}

func boolSym(t bool) sym {
	if t {
		return sym{c: 1}
	}
	return sym{}
}

// symOp is shape arithmetic: exact where both are plain integers, and
// products and quotients with the batch size where they are multiples of it.
func symOp(op string, x, y sym) (sym, error) {
	bad := fmt.Errorf("%s of %v and %v: ppnode cannot compute this from the batch size", op, x, y)
	if !x.n && !y.n {
		var v int64
		switch op {
		case "add":
			v = x.c + y.c
		case "sub":
			v = x.c - y.c
		case "mul":
			v = x.c * y.c
		case "div":
			if y.c == 0 {
				return sym{}, fmt.Errorf("integer division by zero")
			}
			v = floorDiv(x.c, y.c)
		case "mod":
			if y.c == 0 {
				return sym{}, fmt.Errorf("integer division by zero")
			}
			v = x.c - floorDiv(x.c, y.c)*y.c
		case "min":
			v = min(x.c, y.c)
		case "max":
			v = max(x.c, y.c)
		case "eq":
			return boolSym(x.c == y.c), nil
		case "lt":
			return boolSym(x.c < y.c), nil
		case "gt":
			return boolSym(x.c > y.c), nil
		case "and":
			return boolSym(x.c != 0 && y.c != 0), nil
		case "or":
			return boolSym(x.c != 0 || y.c != 0), nil
		case "xor":
			return boolSym((x.c != 0) != (y.c != 0)), nil
		case "pow":
			if y.c < 0 || y.c > 62 {
				return sym{}, bad
			}
			v = 1
			for range y.c {
				v *= x.c
			}
		default:
			return sym{}, bad
		}
		return sym{c: v}, nil
	}
	switch op {
	case "mul":
		if x.n && y.n {
			return sym{}, bad
		}
		return sym{c: x.c * y.c, n: true}, nil
	case "div":
		switch {
		case x.n && y.n && y.c != 0 && x.c%y.c == 0:
			return sym{c: x.c / y.c}, nil
		case x.n && !y.n && y.c != 0 && x.c%y.c == 0:
			return sym{c: x.c / y.c, n: true}, nil
		}
	case "add", "sub":
		if x.n && y.n {
			c := x.c + y.c
			if op == "sub" {
				c = x.c - y.c
			}
			if c == 0 {
				return sym{}, nil
			}
			return sym{c: c, n: true}, nil
		}
	case "eq":
		// The batch size is at least one: a multiple of it equals no
		// integer below its coefficient.
		if x.n != y.n {
			c, s := y.c, x.c
			if y.n {
				c, s = x.c, y.c
			}
			if s > 0 && c < s {
				return sym{}, nil
			}
		} else if x == y {
			return sym{c: 1}, nil
		}
	case "max", "min":
		if x.n != y.n {
			c, s := y.c, x.c
			if y.n {
				c, s = x.c, y.c
			}
			if s > 0 && c <= s {
				if op == "max" {
					return sym{c: s, n: true}, nil
				}
				return sym{c: c}, nil
			}
		}
	}
	return sym{}, bad
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if (a%b != 0) && ((a < 0) != (b < 0)) {
		q--
	}
	return q
}

// unaryK computes a unary operation of a constant.
func unaryK(op string, k *konst) (*konst, error) {
	if k.kind != kFloat {
		out := &konst{shape: k.shape, batch: k.batch, kind: k.kind, i: make([]sym, len(k.i))}
		for e, v := range k.i {
			switch {
			case op == "neg":
				out.i[e] = sym{c: -v.c, n: v.n}
			case op == "abs" && !v.n:
				out.i[e] = sym{c: max(v.c, -v.c)}
			case op == "not" && !v.n:
				out.i[e] = boolSym(v.c == 0)
			case op == "floor" || op == "ceil":
				out.i[e] = v
			default:
				return nil, fmt.Errorf("%s of integer constants", op)
			}
		}
		return out, nil
	}
	out := newFloat(k.shape, make([]float32, len(k.f)))
	out.batch = k.batch
	for e, v := range k.f {
		x := float64(v)
		var y float64
		switch op {
		case "neg":
			y = -x
		case "abs":
			y = math.Abs(x)
		case "sqrt":
			y = math.Sqrt(x)
		case "exp":
			y = math.Exp(x)
		case "log":
			y = math.Log(x)
		case "floor":
			y = math.Floor(x)
		case "ceil":
			y = math.Ceil(x)
		case "reciprocal":
			y = 1 / x
		default:
			return nil, fmt.Errorf("%s of float constants", op)
		}
		out.f[e] = float32(y)
	}
	return out, nil
}

// castK converts a constant to kind to (floats to integers toward zero).
func castK(k *konst, to kind) (*konst, error) {
	out := &konst{shape: k.shape, batch: k.batch, kind: to}
	switch {
	case to == kFloat:
		f, ok := k.floats()
		if !ok {
			return nil, fmt.Errorf("a cast of the batch size to float")
		}
		out.f, out.src = f, k.src
	case k.kind == kFloat:
		out.src = asBuffer(k.src) // an integer of a weight is a constant
		out.i = make([]sym, len(k.f))
		for e, v := range k.f {
			if to == kBool {
				out.i[e] = boolSym(v != 0)
				continue
			}
			// NaN, the infinities and what int64 cannot hold become its
			// smallest value, as on x86 (PyTorch there): T5's position
			// buckets take the log of 0 in a branch that Where discards.
			t := int64(math.MinInt64)
			if f := float64(v); f >= -(1<<63) && f < 1<<63 {
				t = int64(f)
			}
			out.i[e] = sym{c: t}
		}
	default:
		out.i, out.src = slices.Clone(k.i), k.src
		if to == kBool {
			for e, v := range out.i {
				out.i[e] = boolSym(v.c != 0)
			}
		}
	}
	return out, nil
}

// asBuffer is src with every element marked a buffer's.
func asBuffer(src []int64) []int64 {
	if src == nil {
		return nil
	}
	out := make([]int64, len(src))
	for e, s := range src {
		out[e] = s
		if s >= 0 {
			out[e] |= bufferBit
		}
	}
	return out
}

// whereK is the elementwise cond ? a : b of constants.
func whereK(cond, a, b *konst) (*konst, error) {
	shape, batch, err := broadcastShapes(cond, a)
	if err != nil {
		return nil, err
	}
	tmp := &konst{shape: shape, batch: batch}
	shape, batch, err = broadcastShapes(tmp, b)
	if err != nil {
		return nil, err
	}
	if (a.kind == kFloat) != (b.kind == kFloat) {
		return nil, fmt.Errorf("where of %s and %s constants", a.kind, b.kind)
	}
	if cond, err = cond.broadcastTo(shape, batch); err != nil {
		return nil, err
	}
	if a, err = a.broadcastTo(shape, batch); err != nil {
		return nil, err
	}
	if b, err = b.broadcastTo(shape, batch); err != nil {
		return nil, err
	}
	c, ok := cond.ints()
	if !ok {
		return nil, fmt.Errorf("a condition that is not boolean")
	}
	out := a.clone()
	for e, t := range c {
		if t != 0 {
			continue
		}
		if out.kind == kFloat {
			out.f[e] = b.f[e]
		} else {
			out.i[e] = b.i[e]
		}
		if out.src != nil || b.src != nil {
			if out.src == nil {
				out.src = make([]int64, len(c))
				for j := range out.src {
					out.src[j] = -1
				}
			}
			out.src[e] = -1
			if b.src != nil {
				out.src[e] = b.src[e]
			}
		}
	}
	return out, nil
}

// constantOfShape is the ONNX operator: a tensor of shape filled with
// value; a dimension of batch size becomes the batch axis.
func constantOfShape(shape []sym, value *konst) (*konst, error) {
	dims := make([]int, len(shape))
	batch := -1
	for a, d := range shape {
		switch {
		case d.n && d.c == 1 && batch < 0:
			batch, dims[a] = a, 1
		case !d.n && d.c >= 0 && d.c <= maxConst:
			dims[a] = int(d.c)
		default:
			return nil, fmt.Errorf("ConstantOfShape of shape %v", shape)
		}
	}
	if err := checkSize(dims); err != nil {
		return nil, err
	}
	if value == nil {
		value = newFloat(nil, []float32{0})
	}
	if value.size() != 1 {
		return nil, fmt.Errorf("ConstantOfShape's value has %d elements", value.size())
	}
	out := value.pick(dims, batch, make([]int, prod(dims)))
	out.src = nil
	return out, nil
}
