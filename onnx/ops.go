package onnx

import (
	"fmt"
	"math"
	"slices"

	"github.com/ppnode/ppnode/nn"
	"github.com/ppnode/ppnode/onnx/onnxpb"
)

// handlers add each supported operator where an input is computed from
// the data; folders compute it where every input is a constant.
var (
	handlers map[string]func(*importer, *onnxpb.NodeProto) error
	folders  map[string]func(*importer, *onnxpb.NodeProto) (*konst, error)
)

func init() {
	handlers = map[string]func(*importer, *onnxpb.NodeProto) error{
		"Relu":    unary(func(*onnxpb.NodeProto) nn.Layer { return nn.ReLU{} }),
		"Sigmoid": unary(func(*onnxpb.NodeProto) nn.Layer { return nn.Sigmoid{} }),
		"Tanh":    unary(func(*onnxpb.NodeProto) nn.Layer { return nn.Tanh{} }),
		"Erf":     unary(func(*onnxpb.NodeProto) nn.Layer { return nn.Erf{} }),
		"LeakyRelu": unary(func(n *onnxpb.NodeProto) nn.Layer {
			return nn.LeakyReLU{Alpha: attrFloat(n, "alpha", 0.01)}
		}),
		"Sqrt":       unaryOp("sqrt"),
		"Exp":        unaryOp("exp"),
		"Log":        unaryOp("log"),
		"Neg":        unaryOp("neg"),
		"Abs":        unaryOp("abs"),
		"Sign":       unaryOp("sign"),
		"Reciprocal": unaryOp("reciprocal"),
		"Sin":        unaryOp("sin"),
		"Cos":        unaryOp("cos"),
		"Softplus":   unaryOp("softplus"),
		"HardSigmoid": unary(func(n *onnxpb.NodeProto) nn.Layer {
			return nn.HardSigmoid{Alpha: attrFloat(n, "alpha", 0.2), Beta: attrFloat(n, "beta", 0.5)}
		}),
		"HardSwish": unary(func(*onnxpb.NodeProto) nn.Layer { return nn.HardSwish{} }),
		"Elu": unary(func(n *onnxpb.NodeProto) nn.Layer {
			return nn.ELU{Alpha: attrFloat(n, "alpha", 1), Gamma: 1}
		}),
		"Selu": unary(func(n *onnxpb.NodeProto) nn.Layer {
			return nn.ELU{Alpha: attrFloat(n, "alpha", 1.67326319217681884765625), Gamma: attrFloat(n, "gamma", 1.05070102214813232421875)}
		}),
		"Celu": unary(func(n *onnxpb.NodeProto) nn.Layer {
			return nn.ELU{Alpha: attrFloat(n, "alpha", 1), Gamma: 1, Celu: true}
		}),
		"ppnode.HardSwish":      fusedHardSwish,
		"Gelu":                  gelu,
		"Clip":                  clip,
		"Add":                   arith("add"),
		"Sub":                   arith("sub"),
		"Mul":                   arith("mul"),
		"Div":                   arith("div"),
		"Pow":                   pow,
		"Equal":                 compare("eq"),
		"Less":                  compare("lt"),
		"Greater":               compare("gt"),
		"Where":                 where,
		"Gemm":                  gemm,
		"MatMul":                matmul,
		"Conv":                  conv,
		"ConvTranspose":         convTranspose,
		"BatchNormalization":    batchNorm,
		"LayerNormalization":    layerNorm,
		"InstanceNormalization": instanceNorm,
		"MaxPool":               pool,
		"AveragePool":           pool,
		"GlobalAveragePool":     globalAvgPool,
		"Resize":                resize,
		"Upsample":              resize,
		"Flatten":               flatten,
		"Reshape":               reshape,
		"Transpose":             transpose,
		"DepthToSpace":          depthToSpace,
		"Squeeze":               squeeze,
		"Unsqueeze":             unsqueeze,
		"Concat":                concat,
		"Split":                 split,
		"Slice":                 slice,
		"Gather":                gather,
		"Expand":                expand,
		"Dropout":               dropout,
		"Identity":              identity,
		"Softmax":               softmax(false),
		"LogSoftmax":            softmax(true),
		"ReduceMean":            reduce("mean"),
		"ReduceSum":             reduce("sum"),
		"ReduceMax":             reduce("max"),
		"ReduceMin":             reduce("min"),
		"ReduceL2":              reduce("l2"),
		"ArgMax":                argMax,
		"Tile":                  tile,
		"PRelu":                 prelu,
		"Einsum":                einsum,
		"CumSum":                cumSum,
		"Cast":                  cast,
		"Pad":                   pad,
		"Shape":                 shapeOp,
		"LSTM":                  rnn,
		"GRU":                   rnn,
		"RNN":                   rnn,
		"ppnode.LayerNorm":      layerNorm,
		"ppnode.Linear":         fusedLinear,
		"ppnode.Gelu":           fusedGelu,
		// Operators of constants only: shape arithmetic, masks, indices.
		"Constant":        nil,
		"ConstantOfShape": nil,
		"Range":           nil,
		"Not":             not,
		"And":             nil,
		"Or":              nil,
		"Xor":             nil,
		"Floor":           nil,
		"Ceil":            nil,
		"Min":             minMax(false),
		"Max":             minMax(true),
		"ReduceProd":      nil,
		"Mod":             mod,
		"ScatterND":       nil,
		"Trilu":           nil,
	}
	folders = map[string]func(*importer, *onnxpb.NodeProto) (*konst, error){
		"Constant":        foldConstant,
		"ConstantOfShape": foldConstantOfShape,
		"Range":           foldRange,
		"Trilu":           foldTrilu,
		"MatMul":          foldZeroProduct,
		"Gemm":            foldZeroProduct,
		"ppnode.Linear":   func(im *importer, n *onnxpb.NodeProto) (*konst, error) { return nil, im.runUnfused(n) },
		"Identity":        func(im *importer, n *onnxpb.NodeProto) (*konst, error) { k, _ := im.konst(0); return k, nil },
		"Shape":           foldShape,
		"Gather":          foldGather,
		"Unsqueeze":       foldUnsqueeze,
		"Squeeze":         foldSqueeze,
		"Concat":          foldConcat,
		"Slice":           foldSlice,
		"Reshape":         foldReshape,
		"Flatten":         foldFlatten,
		"Transpose":       foldTranspose,
		"Cast":            foldCast,
		"Expand":          foldExpand,
		"Where":           foldWhere,
		"Dropout":         func(im *importer, n *onnxpb.NodeProto) (*konst, error) { k, _ := im.konst(0); return k, nil },
		"Split":           foldSplit,
		"ScatterND":       foldScatterND,
		"ReduceProd":      foldReduce("prod"),
		"ReduceSum":       foldReduce("sum"),
		"ReduceMean":      foldReduce("mean"),
		"ReduceMax":       foldReduce("max"),
		"ReduceMin":       foldReduce("min"),
	}
	for op, name := range map[string]string{"Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div", "Pow": "pow",
		"Equal": "eq", "Less": "lt", "Greater": "gt", "And": "and", "Or": "or", "Xor": "xor", "Min": "min", "Max": "max", "Mod": "mod"} {
		folders[op] = foldBinary(name)
	}
	for op, name := range map[string]string{"Neg": "neg", "Abs": "abs", "Sqrt": "sqrt", "Exp": "exp", "Log": "log",
		"Floor": "floor", "Ceil": "ceil", "Not": "not", "Reciprocal": "reciprocal"} {
		folders[op] = foldUnary(name)
	}
	for op, h := range handlers {
		if h == nil {
			handlers[op] = func(*importer, *onnxpb.NodeProto) error {
				return fmt.Errorf("%s of values computed from the data is not supported", op)
			}
		}
	}
}

// ---- constants ----

func foldConstant(im *importer, n *onnxpb.NodeProto) (*konst, error) {
	for _, a := range n.GetAttribute() {
		switch a.GetName() {
		case "value":
			return tensorOf(a.GetT())
		case "value_float":
			return newFloat(nil, []float32{a.GetF()}), nil
		case "value_floats":
			return newFloat([]int{len(a.GetFloats())}, slices.Clone(a.GetFloats())), nil
		case "value_int":
			return newInts(nil, a.GetI()), nil
		case "value_ints":
			return newInts([]int{len(a.GetInts())}, a.GetInts()...), nil
		default:
			return nil, fmt.Errorf("attribute %s is not supported", a.GetName())
		}
	}
	return nil, fmt.Errorf("no value")
}

func foldConstantOfShape(im *importer, n *onnxpb.NodeProto) (*konst, error) {
	k, _ := im.konst(0)
	s, ok := k.syms()
	if !ok || len(k.shape) > 1 {
		return nil, fmt.Errorf("shape %v is not a list of integers", k.shape)
	}
	var v *konst
	for _, a := range n.GetAttribute() {
		if a.GetName() == "value" {
			var err error
			if v, err = tensorOf(a.GetT()); err != nil {
				return nil, err
			}
		}
	}
	out, err := constantOfShape(s, v)
	if src := im.shapeOf[k]; err != nil && src != nil {
		// Of a value's shape with the batch in an axis of several
		// (attention's [N·heads, ...]): a value like src, as full_like.
		f, isInt := float32(0), false
		if v != nil {
			if f, ok = uniform(v); !ok {
				return nil, err
			}
			isInt = v.kind != kFloat
		}
		im.set(0, &value{name: im.add("", nn.Select{A: f, B: f}, src), stored: src.stored, dims: src.dims, isInt: isInt})
		return nil, nil
	}
	return out, err
}

func foldRange(im *importer, n *onnxpb.NodeProto) (*konst, error) {
	if im.batchRange() { // torch.arange over the batch: see pick.go
		im.perRow[n.GetOutput()[0]] = &batchRows{scale: 1}
		return nil, nil
	}
	var vs [3]float32
	isInt := true
	for i := range vs {
		k, ok := im.konst(i)
		if !ok {
			return nil, fmt.Errorf("input %d is missing", i)
		}
		x, ok := k.scalar()
		if !ok {
			return nil, fmt.Errorf("input %d is not a scalar", i)
		}
		vs[i], isInt = x, isInt && k.kind != kFloat
	}
	start, limit, delta := float64(vs[0]), float64(vs[1]), float64(vs[2])
	if delta == 0 {
		return nil, fmt.Errorf("range step 0")
	}
	count := int(max(math.Ceil((limit-start)/delta), 0))
	if count > maxConst {
		return nil, fmt.Errorf("range of %d elements", count)
	}
	if isInt {
		out := newInts([]int{count})
		out.i = make([]sym, count)
		for j := range out.i {
			out.i[j] = sym{c: int64(start) + int64(j)*int64(delta)}
		}
		return out, nil
	}
	out := newFloat([]int{count}, make([]float32, count))
	for j := range out.f {
		out.f[j] = float32(start + float64(j)*delta)
	}
	return out, nil
}

// foldZeroProduct folds MatMul and Gemm whose left operand is a constant
// zero, a recurrent cell's initial state (torch.zeros(N, hidden) before a
// loop over nn.LSTMCell): zeros, plus Gemm's bias, which keeps its
// parameter's elements and trains as in PyTorch (the product passes the
// weight no gradient; the weight trains where the cell reads real states).
func foldZeroProduct(im *importer, n *onnxpb.NodeProto) (*konst, error) {
	a, _ := im.konst(0)
	w, _ := im.konst(1)
	f, ok := a.floats()
	if !ok || a.trainable() || len(a.shape) < 1 || slices.ContainsFunc(f, func(v float32) bool { return v != 0 }) {
		return nil, fmt.Errorf("a product of constants (only a zero state times a weight folds)")
	}
	gemm := n.GetOpType() == "Gemm"
	if gemm && (attrInt(n, "transA", 0) != 0 || attrFloat(n, "alpha", 1) != 1 || attrFloat(n, "beta", 1) != 1) {
		return nil, fmt.Errorf("only alpha=1, beta=1, transA=0 are supported")
	}
	if len(w.shape) != 2 {
		return nil, fmt.Errorf("a product with a constant of shape %v", w.shape)
	}
	k, p := w.shape[0], w.shape[1]
	if gemm && attrInt(n, "transB", 0) != 0 {
		k, p = p, k
	}
	r := len(a.shape)
	if a.shape[r-1] != k {
		return nil, fmt.Errorf("a product of shapes %v and %v", a.shape, w.shape)
	}
	target := make([]sym, r)
	for j, d := range a.shape {
		target[j] = sym{c: int64(d)}
		if j == a.batch {
			target[j] = sym{c: 1, n: true}
		}
	}
	target[r-1] = sym{c: int64(p)}
	if gemm && im.has(2) {
		b, ok := im.konst(2)
		if !ok {
			return nil, fmt.Errorf("the bias must be a constant")
		}
		return b.expand(target)
	}
	return newFloat([]int{p}, make([]float32, p)).expand(target)
}

// foldTrilu keeps the upper (upper=1) or lower triangle of a constant's
// last two axes from diagonal k and zeroes the rest: torch.triu and
// torch.tril, as a causal mask made in forward (opset 14).
func foldTrilu(im *importer, n *onnxpb.NodeProto) (*konst, error) {
	x, _ := im.konst(0)
	r := len(x.shape)
	if r < 2 || x.batch >= 0 {
		return nil, fmt.Errorf("a triangle of a constant of shape %v", x.shape)
	}
	diag := int64(0)
	if im.has(1) {
		k, ok := im.konst(1)
		var d []int64
		if ok {
			d, ok = k.ints()
		}
		if !ok || len(d) != 1 {
			return nil, fmt.Errorf("the diagonal must be one integer")
		}
		diag = d[0]
	}
	upper := attrInt(n, "upper", 1) != 0
	out := x.clone()
	each(x.shape, func(idx []int, e int) {
		if off := int64(idx[r-1] - idx[r-2]); upper && off >= diag || !upper && off <= diag {
			return
		}
		if out.kind == kFloat {
			out.f[e] = 0
		} else {
			out.i[e] = sym{}
		}
		if out.src != nil {
			out.src[e] = -1
		}
	})
	return out, nil
}

// foldShape gives a constant's shape; for values see shapeOp.
func foldShape(im *importer, n *onnxpb.NodeProto) (*konst, error) {
	k, _ := im.konst(0)
	s := make([]sym, len(k.shape))
	for a, d := range k.shape {
		s[a] = sym{c: int64(d)}
		if a == k.batch {
			s[a] = sym{c: 1, n: true}
		}
	}
	return shapeSlice(n, s), nil
}

func shapeSlice(n *onnxpb.NodeProto, s []sym) *konst {
	r := int64(len(s))
	lo, hi := attrInt(n, "start", 0), attrInt(n, "end", r)
	fix := func(v int64) int {
		if v < 0 {
			v += r
		}
		return int(max(0, min(v, r)))
	}
	a, b := fix(lo), fix(hi)
	s = s[a:max(a, b)]
	return newSyms([]int{len(s)}, slices.Clone(s))
}

func shapeOp(im *importer, n *onnxpb.NodeProto) error {
	v, err := im.val(0)
	if err != nil {
		return err
	}
	k := shapeSlice(n, v.shape())
	if len(k.i) == v.rank() {
		im.shapeOf[k] = v
	}
	im.setK(0, k)
	return nil
}

func foldGather(im *importer, n *onnxpb.NodeProto) (*konst, error) {
	data, _ := im.konst(0)
	idx, _ := im.konst(1)
	axis, err := normAxis(attrInt(n, "axis", 0), len(data.shape))
	if err != nil {
		return nil, err
	}
	if idx.trainable() {
		return nil, fmt.Errorf("indices from a parameter")
	}
	im.freeze(idx)
	return data.gather(idx, axis)
}

// axesOf reads the axes of Squeeze and Unsqueeze (an attribute before
// opset 13, then an input).
func (im *importer) axesInput(n *onnxpb.NodeProto, r int) ([]int, bool, error) {
	raw, ok := attrInts(n, "axes")
	if k, has := im.konst(1); has {
		im.freeze(k)
		if raw, ok = k.ints(); !ok {
			return nil, false, fmt.Errorf("axes are not integers")
		}
	}
	if !ok {
		return nil, false, nil
	}
	axes := make([]int, len(raw))
	for j, a := range raw {
		x, err := normAxis(a, r)
		if err != nil {
			return nil, false, err
		}
		axes[j] = x
	}
	slices.Sort(axes)
	if len(slices.Compact(slices.Clone(axes))) != len(axes) {
		return nil, false, fmt.Errorf("axes %v repeat", raw)
	}
	return axes, true, nil
}

func foldUnsqueeze(im *importer, n *onnxpb.NodeProto) (*konst, error) {
	k, _ := im.konst(0)
	raw, _ := attrInts(n, "axes")
	if a, has := im.konst(1); has {
		raw, _ = a.ints()
	}
	axes, _, err := im.axesInput(n, len(k.shape)+len(raw))
	if err != nil {
		return nil, err
	}
	shape := slices.Clone(k.shape)
	batch := k.batch
	for _, a := range axes {
		if a > len(shape) {
			return nil, fmt.Errorf("axes %v of %v", axes, k.shape)
		}
		shape = slices.Insert(shape, a, 1)
		if batch >= a {
			batch++
		}
	}
	out := *k
	out.shape, out.batch = shape, batch
	return &out, nil
}

func foldSqueeze(im *importer, n *onnxpb.NodeProto) (*konst, error) {
	k, _ := im.konst(0)
	axes, ok, err := im.axesInput(n, len(k.shape))
	if err != nil {
		return nil, err
	}
	var shape []int
	batch := -1
	for a, d := range k.shape {
		drop := ok && slices.Contains(axes, a) || !ok && d == 1 && a != k.batch
		if drop && (d != 1 || a == k.batch) {
			return nil, fmt.Errorf("squeeze of axis %d of %v", a, k.shape)
		}
		if !drop {
			if a == k.batch {
				batch = len(shape)
			}
			shape = append(shape, d)
		}
	}
	out := *k
	out.shape, out.batch = shape, batch
	return &out, nil
}

func foldConcat(im *importer, n *onnxpb.NodeProto) (*konst, error) {
	var ks []*konst
	for i := range n.GetInput() {
		k, ok := im.konst(i)
		if !ok {
			continue
		}
		ks = append(ks, k)
	}
	if len(ks) == 0 {
		return nil, fmt.Errorf("no inputs")
	}
	axis, err := normAxis(attrInt(n, "axis", 0), len(ks[0].shape))
	if err != nil {
		return nil, err
	}
	// Shape lists mix ints of shape arithmetic with the batch size: fine.
	return concatK(ks, axis)
}

// sliceArgs reads Slice's starts, ends, axes and steps (attributes before
// opset 10, then inputs).
func (im *importer) sliceArgs(n *onnxpb.NodeProto) (starts, ends, axes, steps []int64, err error) {
	if im.opset < 10 {
		starts, _ = attrInts(n, "starts")
		ends, _ = attrInts(n, "ends")
		axes, _ = attrInts(n, "axes")
	} else {
		get := func(i int) ([]int64, error) {
			if !im.has(i) {
				return nil, nil
			}
			k, ok := im.konst(i)
			if !ok {
				return nil, fmt.Errorf("input %d must be a constant", i)
			}
			im.freeze(k)
			v, ok := k.ints()
			if !ok {
				return nil, fmt.Errorf("input %d is not a list of integers", i)
			}
			return v, nil
		}
		for i, dst := range []*[]int64{&starts, &ends, &axes, &steps} {
			if *dst, err = get(i + 1); err != nil {
				return
			}
		}
	}
	switch {
	case starts == nil || ends == nil:
		err = fmt.Errorf("starts %v and ends %v: both are needed", starts, ends)
	case len(starts) != len(ends) || axes != nil && len(axes) != len(starts) || steps != nil && len(steps) != len(starts):
		err = fmt.Errorf("starts %v ends %v axes %v steps %v differ in length", starts, ends, axes, steps)
	}
	return
}

func foldSlice(im *importer, n *onnxpb.NodeProto) (*konst, error) {
	k, _ := im.konst(0)
	starts, ends, axes, steps, err := im.sliceArgs(n)
	if err != nil {
		return nil, err
	}
	return k.slice(starts, ends, axes, steps)
}

// resolveShape turns a Reshape's target (0: the input's dimension unless
// allowzero, -1: inferred) into sizes of shape arithmetic.
func resolveShape(n *onnxpb.NodeProto, in []sym, target []sym) ([]sym, error) {
	out := slices.Clone(target)
	infer := -1
	for i, d := range out {
		switch {
		case d == sym{} && attrInt(n, "allowzero", 0) == 0:
			if i >= len(in) {
				return nil, fmt.Errorf("shape %v copies dimension %d of %v", target, i, in)
			}
			out[i] = in[i]
		case d == sym{c: -1} && infer < 0:
			infer = i
		case d.c < 1:
			return nil, fmt.Errorf("shape %v", target)
		}
	}
	total, rest := sym{c: 1}, sym{c: 1}
	var err error
	for _, d := range in {
		if total, err = symOp("mul", total, d); err != nil {
			return nil, err
		}
	}
	for i, d := range out {
		if i != infer {
			if rest, err = symOp("mul", rest, d); err != nil {
				return nil, err
			}
		}
	}
	if infer >= 0 {
		if out[infer], err = symOp("div", total, rest); err != nil {
			return nil, fmt.Errorf("shape %v does not fit %v", target, in)
		}
	} else if total != rest {
		return nil, fmt.Errorf("shape %v does not fit %v", target, in)
	}
	return out, nil
}

func konstShape(k *konst) []sym {
	s := make([]sym, len(k.shape))
	for a, d := range k.shape {
		s[a] = sym{c: int64(d)}
		if a == k.batch {
			s[a] = sym{c: 1, n: true}
		}
	}
	return s
}

func plainInts(s []sym) ([]int, bool) {
	out := make([]int, len(s))
	for i, d := range s {
		if d.n || d.c < 0 || d.c > math.MaxInt32 {
			return nil, false
		}
		out[i] = int(d.c)
	}
	return out, true
}

func (im *importer) reshapeTarget(n *onnxpb.NodeProto, in []sym) ([]sym, error) {
	t, ok := im.konst(1)
	if !ok {
		return nil, fmt.Errorf("the shape must be a constant")
	}
	im.freeze(t)
	s, ok := t.syms()
	if !ok || len(t.shape) != 1 {
		return nil, fmt.Errorf("shape %v is not a list of integers", t.shape)
	}
	return resolveShape(n, in, s)
}

func foldReshape(im *importer, n *onnxpb.NodeProto) (*konst, error) {
	k, _ := im.konst(0)
	s, err := im.reshapeTarget(n, konstShape(k))
	if err != nil {
		return nil, err
	}
	shape, ok := plainInts(s)
	if !ok {
		return nil, fmt.Errorf("a reshape of a constant to %v", s)
	}
	return k.reshape(shape)
}

func foldFlatten(im *importer, n *onnxpb.NodeProto) (*konst, error) {
	k, _ := im.konst(0)
	a, err := normAxis(attrInt(n, "axis", 1), len(k.shape)+1)
	if err != nil {
		return nil, err
	}
	return k.reshape([]int{prod(k.shape[:a]), prod(k.shape[a:])})
}

func perm(n *onnxpb.NodeProto) []int {
	p, _ := attrInts(n, "perm")
	out := make([]int, len(p))
	for i, a := range p {
		out[i] = int(max(-1, min(a, math.MaxInt32)))
	}
	return out
}

func foldTranspose(im *importer, n *onnxpb.NodeProto) (*konst, error) {
	k, _ := im.konst(0)
	return k.transpose(perm(n))
}

// castTo maps an ONNX type to a constant's kind.
func castTo(n *onnxpb.NodeProto) (kind, error) {
	switch to := onnxpb.TensorProto_DataType(attrInt(n, "to", 0)); to {
	case onnxpb.TensorProto_FLOAT, onnxpb.TensorProto_DOUBLE, onnxpb.TensorProto_FLOAT16, onnxpb.TensorProto_BFLOAT16:
		return kFloat, nil
	case onnxpb.TensorProto_INT64, onnxpb.TensorProto_INT32, onnxpb.TensorProto_INT16, onnxpb.TensorProto_INT8,
		onnxpb.TensorProto_UINT8, onnxpb.TensorProto_UINT16, onnxpb.TensorProto_UINT32, onnxpb.TensorProto_UINT64:
		return kInt, nil
	case onnxpb.TensorProto_BOOL:
		return kBool, nil
	default:
		return 0, fmt.Errorf("cast to %s", to)
	}
}

func foldCast(im *importer, n *onnxpb.NodeProto) (*konst, error) {
	k, _ := im.konst(0)
	to, err := castTo(n)
	if err != nil {
		return nil, err
	}
	if to != kFloat {
		im.freeze(k)
	}
	return castK(k, to)
}

func foldExpand(im *importer, n *onnxpb.NodeProto) (*konst, error) {
	k, _ := im.konst(0)
	t, _ := im.konst(1)
	im.freeze(t)
	s, ok := t.syms()
	if !ok {
		return nil, fmt.Errorf("shape is not a list of integers")
	}
	return k.expand(s)
}

func foldWhere(im *importer, n *onnxpb.NodeProto) (*konst, error) {
	c, _ := im.konst(0)
	a, _ := im.konst(1)
	b, _ := im.konst(2)
	im.freeze(c)
	return whereK(c, a, b)
}

// foldReduce reduces a constant (shape arithmetic: torch.var's count of
// elements is a ReduceProd of dimensions).
func foldReduce(op string) func(*importer, *onnxpb.NodeProto) (*konst, error) {
	return func(im *importer, n *onnxpb.NodeProto) (*konst, error) {
		k, _ := im.konst(0)
		axes, some, err := im.axesInput(n, len(k.shape))
		if err != nil {
			return nil, err
		}
		if !some && attrInt(n, "noop_with_empty_axes", 0) != 0 {
			return k, nil
		}
		if k.batch >= 0 {
			return nil, fmt.Errorf("a reduction of a constant of the batch's size")
		}
		var f []float64
		if k.kind == kFloat {
			for _, x := range k.f {
				f = append(f, float64(x))
			}
		} else {
			is, ok := k.ints()
			if !ok {
				return nil, fmt.Errorf("a reduction of the batch size")
			}
			for _, x := range is {
				f = append(f, float64(x))
			}
		}
		reduced := func(a int) bool { return !some || slices.Contains(axes, a) }
		var shape, kept []int
		for a, d := range k.shape {
			switch {
			case !reduced(a):
				shape, kept = append(shape, d), append(kept, d)
			case attrInt(n, "keepdims", 1) != 0:
				shape = append(shape, 1)
			}
		}
		out := make([]float64, prod(kept))
		count := make([]int, len(out))
		each(k.shape, func(idx []int, e int) {
			j := 0
			for a, d := range k.shape {
				if !reduced(a) {
					j = j*d + idx[a]
				}
			}
			x := f[e]
			switch {
			case count[j] == 0:
				out[j] = x
			case op == "prod":
				out[j] *= x
			case op == "sum" || op == "mean":
				out[j] += x
			case op == "max":
				out[j] = max(out[j], x)
			case op == "min":
				out[j] = min(out[j], x)
			}
			count[j]++
		})
		if op == "mean" {
			for j := range out {
				out[j] /= float64(count[j])
			}
		}
		if k.kind != kFloat {
			v := make([]int64, len(out))
			for j, x := range out {
				if x != math.Trunc(x) || math.Abs(x) > 1<<53 {
					return nil, fmt.Errorf("an integer reduction out of range")
				}
				v[j] = int64(x)
			}
			im.freeze(k)
			return newInts(shape, v...), nil
		}
		if k.trainable() {
			return nil, fmt.Errorf("a reduction of a parameter")
		}
		im.freeze(k)
		r := make([]float32, len(out))
		for j, x := range out {
			r[j] = float32(x)
		}
		return newFloat(shape, r), nil
	}
}

// foldScatterND writes updates into a copy of data at indices (PyTorch's
// exporter writes an assignment to a slice, such as Swin's attention mask,
// this way).
func foldScatterND(im *importer, n *onnxpb.NodeProto) (*konst, error) {
	data, _ := im.konst(0)
	idx, _ := im.konst(1)
	upd, _ := im.konst(2)
	if data == nil || idx == nil || upd == nil {
		return nil, fmt.Errorf("%d operands, want 3", len(n.GetInput()))
	}
	if r := attrString(n, "reduction", "none"); r != "none" {
		return nil, fmt.Errorf("reduction %s is not supported", r)
	}
	im.freeze(idx)
	return data.scatterND(idx, upd)
}

func foldSplit(im *importer, n *onnxpb.NodeProto) (*konst, error) {
	k, _ := im.konst(0)
	axis, err := normAxis(attrInt(n, "axis", 0), len(k.shape))
	if err != nil {
		return nil, err
	}
	sizes, err := im.splitSizes(n, k.shape[axis])
	if err != nil {
		return nil, err
	}
	from := 0
	for i, s := range sizes {
		part, err := k.slice([]int64{int64(from)}, []int64{int64(from + s)}, []int64{int64(axis)}, nil)
		if err != nil {
			return nil, err
		}
		im.setK(i, part)
		from += s
	}
	k0, _ := im.consts[n.GetOutput()[0]]
	return k0, nil
}

func foldBinary(op string) func(*importer, *onnxpb.NodeProto) (*konst, error) {
	return func(im *importer, n *onnxpb.NodeProto) (*konst, error) {
		a, okA := im.konst(0)
		b, okB := im.konst(1)
		if !okA || !okB {
			return nil, fmt.Errorf("%d operands, want 2", len(n.GetInput()))
		}
		im.freeze(a, b)
		return binaryK(op, a, b)
	}
}

func foldUnary(op string) func(*importer, *onnxpb.NodeProto) (*konst, error) {
	return func(im *importer, n *onnxpb.NodeProto) (*konst, error) {
		k, _ := im.konst(0)
		if op != "neg" {
			im.freeze(k)
		}
		out, err := unaryK(op, k)
		if err == nil && op == "neg" {
			im.freeze(k)
		}
		return out, err
	}
}

// ---- the layout of a constant against a value ----

// operand lays out the constant k, broadcast against value v (numpy rules,
// aligned at the last axis), in v's stored layout: its per-sample shape
// (v's stored rank, each axis v's size or 1), its values and, for a konst
// of initializers, where each value comes from.
func (im *importer) operand(v *value, k *konst) ([]int, []float32, []int64, error) {
	r, kr := v.rank(), len(k.shape)
	kdim := func(d int) int { // k's size along v's axis d
		if j := d - (r - kr); j >= 0 {
			return k.shape[j]
		}
		return 1
	}
	for j := 0; j < kr-r; j++ {
		if k.shape[j] != 1 {
			return nil, nil, nil, fmt.Errorf("a constant of shape %v against values of shape %v", k.shape, v)
		}
	}
	for d := 0; d < r; d++ {
		kd := kdim(d)
		if kd == 1 {
			continue
		}
		if slices.Contains(v.dims[d], 0) || int64(kd) != v.dim(d).c {
			return nil, nil, nil, fmt.Errorf("a constant of shape %v does not broadcast against values of shape %v", k.shape, v)
		}
	}
	f, ok := k.floats()
	if !ok {
		return nil, nil, nil, fmt.Errorf("a constant that holds the batch size")
	}
	S := len(v.stored)
	own := v.owner()
	shape := make([]int, S)
	for a := 1; a <= S; a++ {
		shape[a-1] = 1
		if d := own[a]; d >= 0 && kdim(d) != 1 {
			shape[a-1] = v.axisSize(a)
		}
	}
	kst := strides(k.shape)
	// pos[a] is the position of stored axis a within its ONNX axis (the
	// stride of its index there).
	pos := make([]int, S+1)
	for _, as := range v.dims {
		st := 1
		for j := len(as) - 1; j >= 0; j-- {
			if as[j] != 0 {
				pos[as[j]] = st
				st *= v.axisSize(as[j])
			}
		}
	}
	data := make([]float32, prod(shape))
	var src []int64
	if k.src != nil {
		src = make([]int64, len(data))
	}
	each(shape, func(idx []int, e int) {
		j := 0
		for a := 1; a <= S; a++ {
			d := own[a]
			if d < 0 || shape[a-1] == 1 {
				continue
			}
			if kj := d - (r - kr); kj >= 0 {
				j += idx[a-1] * pos[a] * kst[kj]
			}
		}
		data[e] = f[j]
		if src != nil {
			src[e] = k.src[j]
		}
	})
	return shape, data, src, nil
}

// paramOf makes the trainable parameter that the konst's initializer
// elements are, for layer: the whole initializer, and the map from the
// konst's elements to its elements. Every element must come from one
// initializer.
func (im *importer) paramOf(src []int64, layer string) (*nn.Param, []int32, error) {
	id := -1
	m := make([]int32, len(src))
	for e, s := range src {
		if s < 0 || s&bufferBit != 0 {
			return nil, nil, fmt.Errorf("a weight that is partly a constant or a buffer")
		}
		if id >= 0 && int(s>>32) != id {
			return nil, nil, fmt.Errorf("a weight from two initializers (%s and %s)", im.inits[id].name, im.inits[s>>32].name)
		}
		id = int(s >> 32)
		m[e] = int32(s & (bufferBit - 1))
	}
	if id < 0 {
		return nil, nil, fmt.Errorf("an empty weight")
	}
	im.train(id, layer)
	in := im.inits[id]
	p := &nn.Param{Value: nn.New(shapeOrScalar(in.k.shape)...), Grad: nn.New(shapeOrScalar(in.k.shape)...), Given: slices.Clone(in.k.f)}
	identity := len(m) == len(in.k.f)
	for e, j := range m {
		identity = identity && int(j) == e
	}
	if identity {
		m = nil
	}
	return p, m, nil
}

// train records that layer trains initializer id. A second layer that
// reads it holds a copy (tied weights: see nn.Ties).
func (im *importer) train(id int, layer string) {
	if _, ok := im.trained[id]; !ok {
		im.trained[id] = layer
	}
}

// nameParam names p after its initializer once the layer is in the graph
// (the builder prefixes parameter names with the layer's).
func (im *importer) nameParam(p *nn.Param, src []int64) {
	for _, s := range src {
		if s >= 0 {
			p.Name = im.inits[s>>32].name
			return
		}
	}
}

// whole returns the initializer that k is, element for element in the
// order perm gives (k = Transpose(init, perm); nil: the identity).
func (im *importer) whole(k *konst, perm []int) (int, bool) {
	if k.src == nil || len(k.src) == 0 || k.src[0] < 0 {
		return 0, false
	}
	id := int(k.src[0] >> 32)
	in := im.inits[id].k
	if len(in.shape) != len(k.shape) {
		return 0, false
	}
	if perm == nil {
		perm = make([]int, len(k.shape))
		for i := range perm {
			perm[i] = i
		}
	}
	for a, p := range perm {
		if k.shape[a] != in.shape[p] {
			return 0, false
		}
	}
	st := strides(in.shape)
	ok := true
	each(k.shape, func(idx []int, e int) {
		j := 0
		for a, p := range perm {
			j += idx[a] * st[p]
		}
		ok = ok && k.src[e] == int64(id)<<32|int64(j)
	})
	return id, ok
}

// rows returns the rank-2 initializer whose rows [lo, hi) k is, taken
// transposed (k = Transpose(init[lo:hi, :])): a Linear's weight split
// from a larger one, as cross-attention splits its in_proj_weight.
func (im *importer) rows(k *konst) (id, lo, hi int, ok bool) {
	if len(k.shape) != 2 || len(k.src) == 0 || k.src[0] < 0 || k.src[0]&bufferBit != 0 {
		return 0, 0, 0, false
	}
	id = int(k.src[0] >> 32)
	in := im.inits[id].k
	if len(in.shape) != 2 || in.shape[1] != k.shape[0] {
		return 0, 0, 0, false
	}
	lo = int(k.src[0]&(bufferBit-1)) / in.shape[1]
	hi = lo + k.shape[1]
	if hi > in.shape[0] {
		return 0, 0, 0, false
	}
	ok = true
	each(k.shape, func(idx []int, e int) {
		ok = ok && k.src[e] == int64(id)<<32|int64((lo+idx[1])*in.shape[1]+idx[0])
	})
	return id, lo, hi, ok
}

// give starts p at initializer id's values (in the exported layout), named
// after it; shape is the exported shape if it differs from the file's.
func (im *importer) give(p *nn.Param, id int, shape ...int) {
	in := im.inits[id]
	if len(shape) == 0 {
		shape = in.k.shape
	}
	p.Name = in.name
	v, err := p.FromExported(in.k.f, shape)
	if err != nil && im.err == nil {
		im.err = modelErr("parameter %v", err)
	}
	p.Given = v
}

// ---- elementwise ----

func unary(mk func(*onnxpb.NodeProto) nn.Layer) func(*importer, *onnxpb.NodeProto) error {
	return func(im *importer, n *onnxpb.NodeProto) error {
		v, err := im.val(0)
		if err != nil {
			return err
		}
		if v.isInt {
			return fmt.Errorf("%s of integers", n.GetOpType())
		}
		im.set(0, im.same(v, im.add("", mk(n), v)))
		return nil
	}
}

func unaryOp(op string) func(*importer, *onnxpb.NodeProto) error {
	return unary(func(*onnxpb.NodeProto) nn.Layer { return &nn.Unary{Op: op} })
}

// same is the value of a layer's output stored and seen as v is.
func (im *importer) same(v *value, name string) *value {
	return &value{name: name, stored: v.stored, dims: v.dims, isInt: v.isInt}
}

func gelu(im *importer, n *onnxpb.NodeProto) error {
	if a := attrString(n, "approximate", "none"); a != "none" {
		return fmt.Errorf("approximate=%q: only the exact (erf) GELU is supported", a)
	}
	return unary(func(*onnxpb.NodeProto) nn.Layer { return nn.GELU{} })(im, n)
}

// fusedGelu is GELU's erf form (see fuse): x·(erf(x/√2) + 1)·0.5.
func fusedGelu(im *importer, n *onnxpb.NodeProto) error {
	want := []float32{math.Sqrt2, 1, 0.5}
	var ks []*konst
	for i, w := range want {
		k, ok := im.konst(1 + i)
		v, ok2 := scalarOf(k, ok)
		if !ok2 || v != w {
			return im.runUnfused(n)
		}
		ks = append(ks, k)
	}
	if _, err := im.val(0); err != nil {
		return im.runUnfused(n)
	}
	im.freeze(ks...)
	return unary(func(*onnxpb.NodeProto) nn.Layer { return nn.GELU{} })(im, n)
}

// fusedHardSwish is hardswish at opset 13: x·HardSigmoid(x) (see fuse).
func fusedHardSwish(im *importer, n *onnxpb.NodeProto) error {
	if v, err := im.val(0); err != nil || v.isInt {
		return im.runUnfused(n)
	}
	return unary(func(*onnxpb.NodeProto) nn.Layer { return nn.HardSwish{} })(im, n)
}

func clip(im *importer, n *onnxpb.NodeProto) error {
	lo, hi := float32(math.Inf(-1)), float32(math.Inf(1))
	if im.opset < 11 {
		lo, hi = attrFloat(n, "min", lo), attrFloat(n, "max", hi)
	}
	for i, dst := range []*float32{&lo, &hi} {
		if !im.has(i + 1) {
			continue
		}
		k, ok := im.konst(i + 1)
		if !ok {
			return fmt.Errorf("bounds must be constants")
		}
		im.freeze(k)
		x, ok := k.scalar()
		if !ok {
			return fmt.Errorf("bound of shape %v", k.shape)
		}
		*dst = x
	}
	return unary(func(*onnxpb.NodeProto) nn.Layer { return &nn.Clip{Min: lo, Max: hi} })(im, n)
}

// arith adds Add, Sub, Mul or Div of two values (broadcasting), or of a
// value and a constant (a scalar, a constant tensor, or a trainable
// parameter from the file's initializers).
func arith(op string) func(*importer, *onnxpb.NodeProto) error {
	return func(im *importer, n *onnxpb.NodeProto) error {
		if len(n.GetInput()) != 2 {
			return fmt.Errorf("%d operands, want 2", len(n.GetInput()))
		}
		a, errA := im.val(0)
		b, errB := im.val(1)
		switch {
		case errA == nil && errB == nil:
			v, err := im.binary(op, a, b)
			if err != nil {
				return err
			}
			im.set(0, v)
			return nil
		case errA == nil || errB == nil:
			v, k, swapped := a, 1, false
			if errA != nil {
				v, k, swapped = b, 0, true
			}
			c, ok := im.konst(k)
			if !ok {
				return fmt.Errorf("operand %q is neither a value nor a constant", n.GetInput()[k])
			}
			out, err := im.withConst(op, v, c, swapped)
			if err != nil {
				return err
			}
			im.set(0, out)
			return nil
		}
		return fmt.Errorf("no operand is computed from the data")
	}
}

// binary adds a op b of two values: of one shape, or b broadcast along
// axes where a has more.
func (im *importer) binary(op string, a, b *value) (*value, error) {
	ints := a.isInt && b.isInt && (op == "add" || op == "sub" || op == "mul")
	if (a.isInt || b.isInt) && !ints {
		return nil, fmt.Errorf("%s of integers", op)
	}
	flip := false
	if !broadcastsTo(b, a) {
		if !broadcastsTo(a, b) {
			return nil, fmt.Errorf("operands of shapes %v and %v", a, b)
		}
		a, b, flip = b, a, true
	}
	bb, err := im.alignTo(b, a)
	if err != nil && a.plain() && b.plain() {
		// Stored differently (an axis split in one, whole in the other):
		// both in ONNX's order, each axis one stored axis.
		if a, err = im.rowMajor(a); err == nil {
			if b, err = im.rowMajor(b); err == nil {
				bb, err = im.alignTo(b, a)
			}
		}
	}
	if err != nil {
		return nil, err
	}
	ins := []*value{a, bb}
	if flip {
		ins = []*value{bb, a}
	}
	var l nn.Layer
	switch {
	case !slices.Equal(bb.stored, a.stored):
		l = &nn.Broadcast{Op: op}
	case op == "add":
		l = nn.Add{}
	default:
		l = &nn.Binary{Op: op}
	}
	out := im.same(a, im.add("", l, ins...))
	out.isInt = ints
	return out, nil
}

// broadcastsTo reports whether b's shape broadcasts to a's (same rank,
// each axis equal or 1 in b).
func broadcastsTo(b, a *value) bool {
	if a.rank() != b.rank() {
		return false
	}
	for d := range a.dims {
		if bd := b.dim(d); bd != a.dim(d) && bd != (sym{c: 1}) {
			return false
		}
	}
	return true
}

// withConst adds v op c (c op v when swapped).
func (im *importer) withConst(op string, v *value, c *konst, swapped bool) (*value, error) {
	if v.isInt {
		// Ids shifted, scaled or taken modulo an integer (position ids
		// from a mask) stay ids: float32 holds them exactly below 2^24.
		x, ok := c.scalar()
		intOp := op == "add" || op == "sub" || op == "mul" || (op == "mod" || op == "fmod") && x != 0
		if !ok || c.trainable() || x != float32(int32(x)) || !intOp {
			return nil, fmt.Errorf("%s of integers by other than an integer constant", op)
		}
		im.freeze(c)
		sop := op
		if swapped && op == "sub" {
			sop = "rsub"
		}
		out := im.same(v, im.add("", &nn.Scalar{Op: sop, C: x}, v))
		out.isInt = true
		return out, nil
	}
	sop := op
	if swapped && (op == "sub" || op == "div") {
		sop = "r" + op
	}
	train := c.trainable()
	if x, ok := c.scalar(); ok && !train && len(c.shape) <= v.rank() {
		im.freeze(c)
		return im.same(v, im.add("", &nn.Scalar{Op: sop, C: x}, v)), nil
	}
	shape, data, src, err := im.operand(v, c)
	if err != nil {
		return nil, err
	}
	l := &nn.BroadcastOp{Op: sop, Shape: shape, Const: data}
	name := im.layerName(im.node.GetName(), "")
	if train {
		p, m, err := im.paramOf(src, name)
		if err != nil {
			return nil, err
		}
		l.Const, l.P, l.Map = nil, p, m
	} else {
		im.freeze(c)
	}
	out := im.same(v, im.b.Add(name, l, v.name))
	if l.P != nil {
		im.nameParam(l.P, src)
	}
	return out, nil
}

// tile repeats a value along its axes (torch's x.repeat): each repeated
// axis gets a stored axis of size 1 in front, expanded to the repeats,
// the ONNX axis spanning both (repetition outermost).
func tile(im *importer, n *onnxpb.NodeProto) error {
	v, err := im.val(0)
	if err != nil {
		return err
	}
	k, ok := im.konst(1)
	var reps []int64
	if ok {
		reps, ok = k.ints()
	}
	if !ok || len(reps) != v.rank() {
		return fmt.Errorf("repeats must be a constant of %d integers", v.rank())
	}
	im.freeze(k)
	for d, r := range reps {
		if r == 1 {
			continue
		}
		if r < 1 || r > 1<<16 {
			return fmt.Errorf("repeats %v: from 1 to 65536 each", reps)
		}
		var at int
		if v, at, err = im.single(v, d); err != nil {
			return err
		}
		shape := slices.Insert(slices.Clone(v.stored), at-1, 1)
		dims := make([][]int, len(v.dims))
		for e, as := range v.dims {
			for _, a := range as {
				if a >= at {
					a++
				}
				dims[e] = append(dims[e], a)
			}
			dims[e] = nonNil(dims[e])
		}
		dims[d] = []int{at, at + 1}
		v = im.reshapeStored(v, shape, dims)
		shape[at-1] = int(r)
		v = im.newValue(im.add("", &nn.Expand{Shape: shape}, v), dims, v.isInt)
	}
	im.set(0, v)
	return nil
}

// mod is Mod of integers computed from the data by an integer constant:
// Python's % (the divisor's sign), or C's fmod with fmod=1 (a sequence
// length taken modulo the length, as Hugging Face's classifiers do).
func mod(im *importer, n *onnxpb.NodeProto) error {
	v, err := im.val(0)
	if err != nil {
		return err
	}
	c, ok := im.konst(1)
	if !ok || !v.isInt {
		return fmt.Errorf("a remainder of other than integers computed from the data by a nonzero integer constant")
	}
	op := "mod"
	if attrInt(n, "fmod", 0) != 0 {
		op = "fmod"
	}
	out, err := im.withConst(op, v, c, false)
	if err != nil {
		return err
	}
	im.set(0, out)
	return nil
}

func pow(im *importer, n *onnxpb.NodeProto) error {
	v, err := im.val(0)
	if err != nil {
		return err
	}
	c, ok := im.konst(1)
	if !ok {
		return fmt.Errorf("the exponent must be a constant")
	}
	im.freeze(c)
	x, ok := c.scalar()
	if !ok {
		return fmt.Errorf("exponent of shape %v", c.shape)
	}
	im.set(0, im.same(v, im.add("", &nn.Scalar{Op: "pow", C: x}, v)))
	return nil
}

func compare(op string) func(*importer, *onnxpb.NodeProto) error {
	return func(im *importer, n *onnxpb.NodeProto) error {
		v, err := im.val(0)
		if err != nil {
			return err
		}
		c, ok := im.konst(1)
		if !ok {
			return fmt.Errorf("comparisons of a value with a constant scalar only")
		}
		im.freeze(c)
		x, ok := c.scalar()
		if !ok {
			return fmt.Errorf("comparisons with a constant of shape %v", c.shape)
		}
		out := im.same(v, im.add("", &nn.Compare{Op: op, C: x}, v))
		out.isInt = true
		im.set(0, out)
		return nil
	}
}

// where adds Where(cond, a, b) with one of a, b a constant scalar:
// masked_fill, with a constant condition or one computed from the data (a
// padding mask); with a condition from the data, a and b may also both be
// constant scalars (a mask of the data) or both values.
func where(im *importer, n *onnxpb.NodeProto) error {
	if c, err := im.val(0); err == nil {
		return whereOf(im, c)
	}
	cond, ok := im.konst(0)
	if !ok {
		return fmt.Errorf("the condition must be a constant or computed from the data")
	}
	im.freeze(cond)
	v, err := im.val(2)
	fillIn, invert := 1, false
	if err != nil {
		if v, err = im.val(1); err != nil {
			return err
		}
		fillIn, invert = 2, true
	}
	fc, ok := im.konst(fillIn)
	if !ok {
		return fmt.Errorf("one of the two branches must be a constant scalar")
	}
	im.freeze(fc)
	fill, ok := fc.scalar()
	if !ok {
		return fmt.Errorf("a fill of shape %v", fc.shape)
	}
	shape, data, _, err := im.operand(v, cond)
	if err != nil {
		return err
	}
	mask := make([]bool, len(data))
	for e, x := range data {
		mask[e] = (x != 0) != invert
	}
	im.set(0, im.same(v, im.add("", &nn.Mask{Shape: shape, Mask: mask, Fill: fill}, v)))
	return nil
}

// prelu is PReLU: x where x > 0, else slope·x, the slope a parameter (one
// value, or one per channel) broadcast as the file gives it, or a constant
// of one value (a LeakyReLU).
func prelu(im *importer, n *onnxpb.NodeProto) error {
	x, err := im.val(0)
	if err != nil {
		return err
	}
	slope, ok := im.konst(1)
	if !ok {
		return fmt.Errorf("the slope must be a constant or a parameter")
	}
	if x.isInt {
		return fmt.Errorf("PRelu of integers")
	}
	if a, ok := uniform(slope); ok && !slope.trainable() {
		im.freeze(slope)
		im.set(0, im.same(x, im.add("", nn.LeakyReLU{Alpha: a}, x)))
		return nil
	}
	y, err := im.withConst("prelu", x, slope, false)
	if err != nil {
		return err
	}
	im.set(0, y)
	return nil
}

// cumSum adds CumSum along a constant axis.
func cumSum(im *importer, n *onnxpb.NodeProto) error {
	v, err := im.val(0)
	if err != nil {
		return err
	}
	k, ok := im.konst(1)
	var a []int64
	if ok {
		im.freeze(k)
		a, ok = k.ints()
	}
	if !ok || len(a) != 1 {
		return fmt.Errorf("the axis must be a constant integer")
	}
	d, err := normAxis(a[0], v.rank())
	if err != nil {
		return err
	}
	if v, err = im.lastDims(v, d); err != nil {
		return err
	}
	l := nn.CumSum{Exclusive: attrInt(n, "exclusive", 0) != 0, Reverse: attrInt(n, "reverse", 0) != 0}
	im.set(0, im.same(v, im.add("", l, v)))
	return nil
}

// minMax is Max (or Min) of a value and a constant of one value: a clamp
// from below (above), with clamp's gradient; of two values, see minMaxOf.
func minMax(isMax bool) func(*importer, *onnxpb.NodeProto) error {
	return func(im *importer, n *onnxpb.NodeProto) error {
		if len(n.GetInput()) != 2 {
			return fmt.Errorf("%d operands: two only", len(n.GetInput()))
		}
		v, err := im.val(0)
		k, ok := im.konst(1)
		if err != nil {
			if v, err = im.val(1); err != nil {
				return err
			}
			k, ok = im.konst(0)
		}
		if w, err := im.val(1); !ok && err == nil {
			return im.minMaxOf(v, w, isMax)
		}
		if !ok {
			return fmt.Errorf("input 1 is missing")
		}
		im.freeze(k)
		u, ok := uniform(k)
		if !ok || !broadcastsToShape(k.shape, v.shape()) || v.isInt {
			return fmt.Errorf("of a value of shape %v and a constant of shape %v: a constant of one value over floats only", v, k.shape)
		}
		l := nn.Clip{Min: float32(math.Inf(-1)), Max: u}
		if isMax {
			l = nn.Clip{Min: u, Max: float32(math.Inf(1))}
		}
		im.set(0, im.same(v, im.add("", l, v)))
		return nil
	}
}

// minMaxOf is Max (Min) of two values: where a − b ≥ 0 (≤ 0), a, else b,
// the gradient going to the one taken (to a at ties).
func (im *importer) minMaxOf(a, b *value, isMax bool) error {
	d, err := im.binary("sub", a, b)
	if err != nil {
		return err
	}
	op := "le"
	if isMax {
		op = "ge"
	}
	c := im.same(d, im.add("", &nn.Compare{Op: op, C: 0}, d))
	c.isInt = true
	y, err := im.choose(c, a, b)
	if err != nil {
		return err
	}
	im.set(0, y)
	return nil
}

// choose is a where the condition c holds, b where it does not: a masked
// to 0 where c does not hold plus b masked where it does, each taking the
// gradient where it is chosen.
func (im *importer) choose(c, a, b *value) (*value, error) {
	var parts [2]*value
	for i, x := range []*value{a, b} {
		p, err := im.maskBy(c, x, 0, i == 0)
		if err != nil {
			return nil, err
		}
		parts[i] = p
	}
	return im.binary("add", parts[0], parts[1])
}

// not is a mask's negation (~mask): 1 where it is 0, else 0.
func not(im *importer, n *onnxpb.NodeProto) error {
	v, err := im.val(0)
	if err != nil {
		return err
	}
	out := im.same(v, im.add("", &nn.Compare{Op: "eq", C: 0}, v))
	out.isInt = true
	im.set(0, out)
	return nil
}

// whereOf is Where with the condition c computed from the data.
func whereOf(im *importer, c *value) error {
	var branch [2]*value
	var fill [2]float32
	var isK [2]bool
	for i := range 2 {
		if v, err := im.val(1 + i); err == nil {
			branch[i] = v
			continue
		}
		k, ok := im.konst(1 + i)
		if !ok {
			return fmt.Errorf("input %d is missing", 1+i)
		}
		im.freeze(k)
		f, ok := uniform(k)
		if !ok || !broadcastsToShape(k.shape, c.shape()) {
			return fmt.Errorf("branch %d: a constant of shape %v that is not one value (or is larger than the condition %v)", 1+i, k.shape, c)
		}
		fill[i], isK[i] = f, true
	}
	switch {
	case isK[0] && isK[1]:
		im.set(0, &value{name: im.add("", nn.Select{A: fill[0], B: fill[1]}, c), stored: c.stored, dims: c.dims})
		return nil
	case isK[0] == isK[1]:
		y, err := im.choose(c, branch[0], branch[1])
		if err != nil {
			return err
		}
		im.set(0, y)
		return nil
	}
	x, f, invert := branch[1], fill[0], false
	if isK[1] {
		x, f, invert = branch[0], fill[1], true
	}
	y, err := im.maskBy(c, x, f, invert)
	if err != nil {
		return err
	}
	im.set(0, y)
	return nil
}

// maskBy is x with f where the condition c holds (where it does not, with
// invert), c broadcast to x.
func (im *importer) maskBy(c, x *value, f float32, invert bool) (*value, error) {
	if x.isInt {
		return nil, fmt.Errorf("a mask over integers")
	}
	if !broadcastsTo(c, x) {
		return nil, fmt.Errorf("a condition of shape %v over values of shape %v", c, x)
	}
	cc, err := im.alignTo(c, x)
	if err != nil && x.plain() && c.plain() {
		if x, err = im.rowMajor(x); err == nil {
			var cr *value
			if cr, err = im.rowMajor(c); err == nil {
				cc, err = im.alignTo(cr, x)
			}
		}
	}
	if err != nil {
		return nil, err
	}
	return im.same(x, im.add("", &nn.MaskBy{Fill: f, Invert: invert}, x, cc)), nil
}

// uniform is the one value all of a float or integer constant's elements
// hold (the batch size not among them).
func uniform(k *konst) (float32, bool) {
	var f []float32
	if k.kind == kFloat {
		f = k.f
	} else {
		is, ok := k.ints()
		if !ok {
			return 0, false
		}
		for _, v := range is {
			f = append(f, float32(v))
		}
	}
	if len(f) == 0 || slices.ContainsFunc(f, func(v float32) bool { return v != f[0] && !(v != v && f[0] != f[0]) }) {
		return 0, false
	}
	return f[0], true
}

// broadcastsToShape reports whether a constant of shape ks broadcasts to
// the shape s without growing it.
func broadcastsToShape(ks []int, s []sym) bool {
	if len(ks) > len(s) {
		return false
	}
	for j := range ks {
		d, sd := ks[len(ks)-1-j], s[len(s)-1-j]
		if d != 1 && (sd.n || int64(d) != sd.c) {
			return false
		}
	}
	return true
}

func identity(im *importer, n *onnxpb.NodeProto) error {
	v, err := im.val(0)
	if err != nil {
		return err
	}
	im.set(0, v)
	return nil
}

func dropout(im *importer, n *onnxpb.NodeProto) error {
	x, err := im.val(0)
	if err != nil {
		return err
	}
	if err := im.noUse(1); err != nil {
		return err
	}
	ratio, train := attrFloat(n, "ratio", 0.5), false
	if c, ok := im.konst(1); ok {
		im.freeze(c)
		if ratio, ok = c.scalar(); !ok {
			return fmt.Errorf("ratio of shape %v", c.shape)
		}
	}
	if c, ok := im.konst(2); ok {
		im.freeze(c)
		t, _ := c.scalar()
		train = t != 0
	}
	if !train || ratio == 0 {
		im.set(0, x)
		return nil
	}
	if !(ratio > 0 && ratio < 1) {
		return fmt.Errorf("ratio %v", ratio)
	}
	im.set(0, im.same(x, im.add("", nn.NewDropout(float64(ratio)), x)))
	return nil
}

func cast(im *importer, n *onnxpb.NodeProto) error {
	v, err := im.val(0)
	if err != nil {
		return err
	}
	to, err := castTo(n)
	if err != nil {
		return err
	}
	switch {
	case to == kFloat:
		out := *v
		out.isInt = false
		im.set(0, &out)
	case !v.isInt: // float to integer: toward zero
		out := im.same(v, im.add("", nn.Truncate{}, v))
		out.isInt = true
		if to == kBool {
			out = im.same(out, im.add("bool", &nn.Compare{Op: "ne", C: 0}, out))
			out.isInt = true
		}
		im.set(0, out)
	case to == kBool:
		out := im.same(v, im.add("", &nn.Compare{Op: "ne", C: 0}, v))
		out.isInt = true
		im.set(0, out)
	default:
		im.set(0, v)
	}
	return nil
}

// ---- shapes of values ----

func flatten(im *importer, n *onnxpb.NodeProto) error {
	v, err := im.val(0)
	if err != nil {
		return err
	}
	a, err := normAxis(attrInt(n, "axis", 1), v.rank()+1)
	if err != nil {
		return err
	}
	var outer, inner []int
	for _, as := range v.dims[:a] {
		outer = append(outer, as...)
	}
	for _, as := range v.dims[a:] {
		inner = append(inner, as...)
	}
	out := *v
	out.dims = [][]int{nonNil(outer), nonNil(inner)}
	im.set(0, &out)
	return nil
}

func nonNil(s []int) []int {
	if s == nil {
		return []int{}
	}
	return s
}

func reshape(im *importer, n *onnxpb.NodeProto) error {
	v, err := im.val(0)
	if err != nil {
		return err
	}
	t, err := im.reshapeTarget(n, v.shape())
	if err != nil {
		return err
	}
	out, err := im.reshapeView(v, t)
	if err != nil {
		return err
	}
	im.set(0, out)
	return nil
}

func transpose(im *importer, n *onnxpb.NodeProto) error {
	v, err := im.val(0)
	if err != nil {
		return err
	}
	p := perm(n)
	if len(p) == 0 {
		for a := v.rank() - 1; a >= 0; a-- {
			p = append(p, a)
		}
	}
	if !isPerm(p, v.rank()) {
		return fmt.Errorf("perm %v of a tensor of %d dimensions", p, v.rank())
	}
	out := *v
	out.dims = make([][]int, len(p))
	for i, a := range p {
		out.dims[i] = v.dims[a]
	}
	im.set(0, &out)
	return nil
}

// depthToSpace is PyTorch's pixel_shuffle (mode CRD) or DepthToSpace's
// default (DCR) as views: [N, C·b·b, H, W] seen as [N, C, b, b, H, W] (or
// [N, b, b, C, H, W]), its axes reordered, seen as [N, C, H·b, W·b].
func depthToSpace(im *importer, n *onnxpb.NodeProto) error {
	v, err := im.val(0)
	if err != nil {
		return err
	}
	b := attrInt(n, "blocksize", 0)
	if v.rank() != 4 || b < 1 || b > 1<<10 {
		return fmt.Errorf("blocksize %d on an input of shape %v", b, v)
	}
	sh := v.shape()
	if sh[1].n || sh[1].c%(b*b) != 0 {
		return fmt.Errorf("%v channels for blocksize %d", sh[1], b)
	}
	c := sym{c: sh[1].c / (b * b)}
	bs := sym{c: b}
	split, p := []sym{sh[0], bs, bs, c, sh[2], sh[3]}, []int{0, 3, 4, 1, 5, 2}
	switch m := attrString(n, "mode", "DCR"); m {
	case "DCR":
	case "CRD":
		split, p = []sym{sh[0], c, bs, bs, sh[2], sh[3]}, []int{0, 1, 4, 2, 5, 3}
	default:
		return fmt.Errorf("mode %s", m)
	}
	if v, err = im.reshapeView(v, split); err != nil {
		return err
	}
	out := *v
	out.dims = make([][]int, len(p))
	for i, a := range p {
		out.dims[i] = v.dims[a]
	}
	y, err := im.reshapeView(&out, []sym{sh[0], c, {c: sh[2].c * b}, {c: sh[3].c * b}})
	if err != nil {
		return err
	}
	im.set(0, y)
	return nil
}

func unsqueeze(im *importer, n *onnxpb.NodeProto) error {
	v, err := im.val(0)
	if err != nil {
		return err
	}
	raw, _ := attrInts(n, "axes")
	if a, has := im.konst(1); has {
		raw, _ = a.ints()
	}
	axes, ok, err := im.axesInput(n, v.rank()+len(raw))
	if err != nil || !ok {
		return fmt.Errorf("axes: %v", err)
	}
	dims := slices.Clone(v.dims)
	for _, a := range axes {
		if a > len(dims) {
			return fmt.Errorf("axes %v of %v", axes, v)
		}
		dims = slices.Insert(dims, a, []int{})
	}
	out := *v
	out.dims = dims
	im.set(0, &out)
	return nil
}

func squeeze(im *importer, n *onnxpb.NodeProto) error {
	v, err := im.val(0)
	if err != nil {
		return err
	}
	axes, ok, err := im.axesInput(n, v.rank())
	if err != nil {
		return err
	}
	var dims [][]int
	for d, as := range v.dims {
		one := v.dim(d) == sym{c: 1}
		drop := ok && slices.Contains(axes, d) || !ok && one
		if drop && !one {
			return fmt.Errorf("squeeze of axis %d of %v", d, v)
		}
		if !drop {
			dims = append(dims, as)
		}
	}
	out := *v
	out.dims = dims
	im.set(0, &out)
	return nil
}

func expand(im *importer, n *onnxpb.NodeProto) error {
	v, err := im.val(0)
	if err != nil {
		return err
	}
	t, ok := im.konst(1)
	if !ok {
		return fmt.Errorf("the shape must be a constant")
	}
	im.freeze(t)
	s, ok := t.syms()
	if !ok {
		return fmt.Errorf("shape is not a list of integers")
	}
	// Leading 1s are a view; so is the rest where it changes nothing.
	lead := len(s) - v.rank()
	for _, d := range s[:max(0, lead)] {
		if d != (sym{c: 1}) {
			return fmt.Errorf("expand of values of shape %v to %v", v, s)
		}
	}
	tail := s[max(0, lead):]
	grow := false
	for j := range tail {
		d, vd := tail[len(tail)-1-j], v.dim(v.rank()-1-j)
		switch {
		case d == sym{c: 1} || d == vd:
		case vd == sym{c: 1} && !d.n:
			grow = true // repeated along an axis of size 1 (a mask over heads)
		default:
			return fmt.Errorf("expand of values of shape %v to %v", v, s)
		}
	}
	out := *v
	if grow {
		w, err := im.rowMajor(v)
		if err != nil {
			return fmt.Errorf("expand of values of shape %v to %v: %w", v, s, err)
		}
		shape := slices.Clone(w.stored)
		for d := 1; d < v.rank(); d++ {
			if ti := d - (v.rank() - len(tail)); ti >= 0 {
				shape[d-1] = max(shape[d-1], int(tail[ti].c))
			}
		}
		out = *im.newValue(im.add("", &nn.Expand{Shape: shape}, w), slices.Clone(w.dims), v.isInt)
	}
	for range max(0, lead) {
		out.dims = append([][]int{{}}, out.dims...)
	}
	im.set(0, &out)
	return nil
}

func concat(im *importer, n *onnxpb.NodeProto) error {
	var ref *value
	for i := range n.GetInput() {
		if v, err := im.val(i); err == nil {
			ref = v
			break
		}
	}
	if ref == nil {
		return fmt.Errorf("no input is computed from the data")
	}
	axis, err := normAxis(attrInt(n, "axis", 1), ref.rank())
	if err != nil {
		return err
	}
	if ref, _, err = im.single(ref, axis); err != nil {
		return err
	}
	var ins []*value
	total := 0
	for i := range n.GetInput() {
		var v *value
		if x, err := im.val(i); err == nil {
			if x.isInt != ref.isInt {
				return fmt.Errorf("concatenation of integers and floats")
			}
			for d := range x.rank() {
				if x.rank() != ref.rank() || d != axis && x.dim(d) != ref.dim(d) {
					return fmt.Errorf("inputs of shapes %v and %v along axis %d", ref, x, axis)
				}
			}
			if x, _, err = im.single(x, axis); err != nil {
				return err
			}
			if v, err = im.alignExcept(x, ref, axis); err != nil {
				return err
			}
		} else {
			k, ok := im.konst(i)
			if !ok {
				return err
			}
			if v, err = im.materialize(ref, k, axis); err != nil {
				return err
			}
		}
		ins = append(ins, v)
		total += int(v.dim(axis).c)
	}
	at := ref.dims[axis][0]
	l := &nn.Concat{Axis: len(ref.stored) - at}
	name := im.add("", l, ins...)
	dims := slices.Clone(ref.dims)
	im.set(0, im.newValue(name, dims, ref.isInt))
	_ = total
	return nil
}

// alignExcept is alignTo for values that differ along ONNX axis d, which
// both store as one axis.
func (im *importer) alignExcept(b, a *value, d int) (*value, error) {
	if a.rank() != b.rank() {
		return nil, fmt.Errorf("shapes %v and %v", a, b)
	}
	// Plan as if both had one size along d, one that no axis of size 1 (which
	// the plan may move) is mistaken for, then give b its own.
	ad, bd := a.dims[d][0], b.dims[d][0]
	same := a.axisSize(ad) + b.axisSize(bd)
	ta := &value{name: a.name, stored: slices.Clone(a.stored), dims: a.dims, isInt: a.isInt}
	tb := &value{name: b.name, stored: slices.Clone(b.stored), dims: b.dims, isInt: b.isInt}
	ta.stored[ad-1], tb.stored[bd-1] = same, same
	order, shape, dims, err := alignPlan(tb, ta)
	if err != nil {
		return nil, err
	}
	shape[ad-1] = b.axisSize(bd)
	return im.reshapeStored(im.permute(b, order), shape, dims), nil
}

// materialize makes a value of the constant k, broadcast along the batch,
// laid out as ref is except along ONNX axis d (a class token before a
// sequence).
func (im *importer) materialize(ref *value, k *konst, d int) (*value, error) {
	r := ref.rank()
	if len(k.shape) != r {
		return nil, fmt.Errorf("a constant of shape %v with values of shape %v", k.shape, ref)
	}
	// k as if it had ref's size along d, to lay it out; then its own.
	full := *ref
	full.stored = slices.Clone(ref.stored)
	at := ref.dims[d][0]
	full.stored[at-1] = k.shape[d]
	kk := *k
	kk.batch = -1
	if k.batch >= 0 {
		kk.shape = slices.Clone(k.shape)
	}
	shape, data, src, err := im.operand(&full, &kk)
	if err != nil {
		return nil, err
	}
	shape[at-1] = k.shape[d]
	l := &nn.ParamBroadcast{Shape: shape, Const: data}
	name := im.layerName(im.node.GetName(), "const")
	if k.trainable() {
		p, m, err := im.paramOf(src, name)
		if err != nil {
			return nil, err
		}
		l.Const, l.P, l.Map = nil, p, m
	} else {
		im.freeze(k)
	}
	out := im.b.Add(name, l, ref.name)
	if l.P != nil {
		im.nameParam(l.P, src)
	}
	return im.newValue(out, slices.Clone(ref.dims), ref.isInt), nil
}

// splitSizes reads Split's sizes (input 1 or the attribute; even parts
// without).
func (im *importer) splitSizes(n *onnxpb.NodeProto, width int) ([]int, error) {
	outs := n.GetOutput()
	var sizes []int64
	if c, ok := im.konst(1); ok {
		im.freeze(c)
		sizes, _ = c.ints()
	} else if s, ok := attrInts(n, "split"); ok {
		sizes = s
	} else {
		if len(outs) == 0 || width%len(outs) != 0 {
			return nil, fmt.Errorf("%d into %d outputs", width, len(outs))
		}
		for range outs {
			sizes = append(sizes, int64(width/len(outs)))
		}
	}
	if len(sizes) != len(outs) {
		return nil, fmt.Errorf("split %v into %d outputs", sizes, len(outs))
	}
	out := make([]int, len(sizes))
	sum := 0
	for i, s := range sizes {
		if s < 0 || s > int64(width) {
			return nil, fmt.Errorf("split %v of %d", sizes, width)
		}
		out[i] = int(s)
		sum += out[i]
	}
	if sum != width {
		return nil, fmt.Errorf("split %v of %d", sizes, width)
	}
	return out, nil
}

func split(im *importer, n *onnxpb.NodeProto) error {
	v, err := im.val(0)
	if err != nil {
		return err
	}
	axis, err := normAxis(attrInt(n, "axis", 0), v.rank())
	if err != nil {
		return err
	}
	v, at, err := im.single(v, axis)
	if err != nil {
		return err
	}
	sizes, err := im.splitSizes(n, v.axisSize(at))
	if err != nil {
		return err
	}
	from := 0
	for i, s := range sizes {
		if s == 0 {
			return fmt.Errorf("an empty part")
		}
		l := &nn.Slice{From: from, To: from + s, Axis: len(v.stored) - at}
		im.set(i, im.newValue(im.add(fmt.Sprint(i), l, v), slices.Clone(v.dims), v.isInt))
		from += s
	}
	return nil
}

func slice(im *importer, n *onnxpb.NodeProto) error {
	v, err := im.val(0)
	if err != nil {
		return err
	}
	starts, ends, axes, steps, err := im.sliceArgs(n)
	if err != nil {
		return err
	}
	for j := range starts {
		ax := int64(j)
		if axes != nil {
			ax = axes[j]
		}
		d, err := normAxis(ax, v.rank())
		if err != nil {
			return err
		}
		step := int64(1)
		if steps != nil {
			step = steps[j]
		}
		if slices.Contains(v.dims[d], 0) {
			if step == 1 && starts[j] == 0 && ends[j] >= math.MaxInt32 {
				continue // the whole batch
			}
			return fmt.Errorf("a slice along the batch")
		}
		size := int(v.dim(d).c)
		first, count, err := sliceRange(starts[j], ends[j], step, size)
		if err != nil {
			return err
		}
		if count == 0 {
			return fmt.Errorf("an empty slice [%d, %d) of %d", starts[j], ends[j], size)
		}
		if first == 0 && count == size && step == 1 {
			continue
		}
		var at int
		if v, at, err = im.single(v, d); err != nil {
			return err
		}
		var l nn.Layer = &nn.Slice{From: first, To: first + (count-1)*int(step) + 1, Step: int(step), Axis: len(v.stored) - at}
		if step < 0 { // backwards (torch.flip): the indices in turn
			idx := make([]int, count)
			for i := range idx {
				idx[i] = first + i*int(step)
			}
			l = &nn.Take{Axis: at - 1, Index: idx}
		} else if step == 1 {
			l = &nn.Slice{From: first, To: first + count, Axis: len(v.stored) - at}
		}
		v = im.newValue(im.add("", l, v), slices.Clone(v.dims), v.isInt)
	}
	im.set(0, v)
	return nil
}

func gather(im *importer, n *onnxpb.NodeProto) error {
	if data, ok := im.konst(0); ok {
		return embedding(im, n, data)
	}
	v, err := im.val(0)
	if err != nil {
		return err
	}
	idx, ok := im.konst(1)
	if !ok {
		return fmt.Errorf("indices computed from the data select from a parameter (an embedding) only")
	}
	im.freeze(idx)
	d, err := normAxis(attrInt(n, "axis", 0), v.rank())
	if err != nil {
		return err
	}
	is, ok := idx.ints()
	if !ok || idx.batch >= 0 {
		return fmt.Errorf("indices are not integers")
	}
	if slices.Contains(v.dims[d], 0) {
		return fmt.Errorf("a gather along the batch")
	}
	v, at, err := im.single(v, d)
	if err != nil {
		return err
	}
	size := v.axisSize(at)
	index := make([]int, len(is))
	for j, x := range is {
		if x < 0 {
			x += int64(size)
		}
		if x < 0 || x >= int64(size) {
			return fmt.Errorf("index %d of an axis of %d", is[j], size)
		}
		index[j] = int(x)
	}
	name := im.add("", &nn.Take{Axis: at - 1, Index: index}, v)
	out := im.newValue(name, nil, v.isInt)
	// The gathered axis becomes idx's axes: none for a scalar index (the
	// stored axis of size 1 stays, unowned), one axis of the stored one
	// for a list, several by splitting it.
	dims := slices.Clone(v.dims[:d])
	switch len(idx.shape) {
	case 0:
	case 1:
		dims = append(dims, []int{at})
	default:
		im.set(0, out)
		return fmt.Errorf("indices of shape %v: one index or a list", idx.shape)
	}
	dims = append(dims, v.dims[d+1:]...)
	out.dims = dims
	im.set(0, out)
	return nil
}

func softmax(log bool) func(*importer, *onnxpb.NodeProto) error {
	return func(im *importer, n *onnxpb.NodeProto) error {
		x, err := im.val(0)
		if err != nil {
			return err
		}
		def := int64(-1)
		if im.opset < 13 {
			def = 1
			if x.rank() != 2 {
				return fmt.Errorf("opset %d's softmax flattens; export with opset 13 or later", im.opset)
			}
		}
		d, err := normAxis(attrInt(n, "axis", def), x.rank())
		if err != nil {
			return err
		}
		if x, err = im.lastDims(x, d); err != nil {
			return err
		}
		var l nn.Layer = nn.Softmax{}
		if log {
			l = nn.LogSoftmax{}
		}
		im.set(0, im.same(x, im.add("", l, x)))
		return nil
	}
}

func reduce(op string) func(*importer, *onnxpb.NodeProto) error {
	return func(im *importer, n *onnxpb.NodeProto) error {
		v, err := im.val(0)
		if err != nil {
			return err
		}
		axes, ok, err := im.axesInput(n, v.rank())
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("a reduction over every axis (the batch included) is not supported")
		}
		keep := attrInt(n, "keepdims", 1) != 0
		// The reduced axes last, then merged into one stored axis.
		if v, err = im.lastDims(v, axes...); err != nil {
			return err
		}
		S, k := len(v.stored), len(axes)
		if k > 1 {
			shape := append(slices.Clone(v.stored[:S-k]), prod(v.stored[S-k:]))
			dims := slices.Clone(v.dims)
			for _, a := range axes {
				dims[a] = nil
			}
			dims[axes[0]] = []int{S - k + 1}
			v = im.reshapeStored(v, shape, dims)
		}
		name := im.add("", &nn.Reduce{Op: op}, v)
		dims := make([][]int, 0, v.rank())
		for d, as := range v.dims {
			switch {
			case !slices.Contains(axes, d):
				dims = append(dims, as)
			case keep:
				dims = append(dims, []int{})
			}
		}
		im.set(0, im.newValue(name, dims, false))
		return nil
	}
}

func pad(im *importer, n *onnxpb.NodeProto) error {
	v, err := im.val(0)
	if err != nil {
		return err
	}
	mode := attrString(n, "mode", "constant")
	if mode != "constant" && mode != "reflect" && mode != "edge" {
		return fmt.Errorf("mode %q: constant, reflect and edge padding are supported", mode)
	}
	ps, ok := attrInts(n, "pads")
	if c, k := im.konst(1); k {
		im.freeze(c)
		ps, ok = c.ints()
	}
	fill := attrFloat(n, "value", 0)
	if c, k := im.konst(2); k {
		im.freeze(c)
		if fill, ok = c.scalar(); !ok {
			return fmt.Errorf("a padding value of shape %v", c.shape)
		}
	}
	r := v.rank()
	if !ok || len(ps) != 2*r {
		return fmt.Errorf("pads %v of a tensor of %d dimensions", ps, r)
	}
	if im.has(3) {
		return fmt.Errorf("Pad's axes input is not supported")
	}
	// The height and width of a feature map: one layer.
	if r == 4 && v.plain() && mode == "constant" && fill == 0 && ps[1] == 0 && ps[5] == 0 {
		p, err := small([]int64{ps[2], ps[3], ps[6], ps[7]}, 0)
		if err != nil {
			return err
		}
		if v, err = im.layout(v, 2, 3, 1); err != nil {
			return err
		}
		l := &nn.Pad2D{Top: p[0], Left: p[1], Bottom: p[2], Right: p[3]}
		im.set(0, im.newValue(im.add("", l, v), [][]int{{0}, {3}, {1}, {2}}, v.isInt))
		return nil
	}
	for d := 0; d < r; d++ {
		before, after := ps[d], ps[d+r]
		if before == 0 && after == 0 {
			continue
		}
		if before < 0 || after < 0 || before > 1<<20 || after > 1<<20 {
			return fmt.Errorf("pads %v: only non-negative padding is supported", ps)
		}
		if slices.Contains(v.dims[d], 0) {
			return fmt.Errorf("padding of the batch")
		}
		var at int
		if v, at, err = im.single(v, d); err != nil {
			return err
		}
		l := &nn.Pad{Axis: at - 1, Before: int(before), After: int(after), Value: fill, Mode: mode}
		v = im.newValue(im.add("", l, v), slices.Clone(v.dims), v.isInt)
	}
	im.set(0, v)
	return nil
}
