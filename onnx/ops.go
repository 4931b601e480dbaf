package onnx

import (
	"fmt"
	"math"
	"slices"
	"strconv"

	"github.com/ppnode/ppnode/nn"
	"github.com/ppnode/ppnode/onnx/onnxpb"
)

// handlers maps each supported operator to the code that adds it.
var handlers map[string]func(*importer, *onnxpb.NodeProto) error

func init() {
	handlers = map[string]func(*importer, *onnxpb.NodeProto) error{
		"Relu":    unary(func(*onnxpb.NodeProto) nn.Layer { return nn.ReLU{} }),
		"Sigmoid": unary(func(*onnxpb.NodeProto) nn.Layer { return nn.Sigmoid{} }),
		"Tanh":    unary(func(*onnxpb.NodeProto) nn.Layer { return nn.Tanh{} }),
		"Erf":     unary(func(*onnxpb.NodeProto) nn.Layer { return nn.Erf{} }),
		"LeakyRelu": unary(func(n *onnxpb.NodeProto) nn.Layer {
			return nn.LeakyReLU{Alpha: attrFloat(n, "alpha", 0.01)}
		}),
		"Gelu":               gelu,
		"Add":                arith("add"),
		"Sub":                arith("sub"),
		"Mul":                arith("mul"),
		"Div":                arith("div"),
		"Gemm":               gemm,
		"MatMul":             matmul,
		"Conv":               conv,
		"BatchNormalization": batchNorm,
		"MaxPool":            pool,
		"AveragePool":        pool,
		"GlobalAveragePool":  globalAvgPool,
		"Flatten":            flatten,
		"Reshape":            reshape,
		"Transpose":          transpose,
		"Concat":             concat,
		"Split":              split,
		"Slice":              slice,
		"Dropout":            dropout,
		"Identity":           identity,
		"Softmax":            softmax(false),
		"LogSoftmax":         softmax(true),
		"Constant":           constantOp,
		"Shape":              shapeOp,
		"Gather":             gather,
		"Unsqueeze":          unsqueeze,
		"Cast":               cast,
		"Pad":                pad,
	}
}

func unary(mk func(*onnxpb.NodeProto) nn.Layer) func(*importer, *onnxpb.NodeProto) error {
	return func(im *importer, n *onnxpb.NodeProto) error {
		v, err := im.act(0)
		if err != nil {
			return err
		}
		im.set(0, &value{name: im.add("", mk(n), v), shape: v.shape, cl: v.cl})
		return nil
	}
}

func gelu(im *importer, n *onnxpb.NodeProto) error {
	if a := attrString(n, "approximate", "none"); a != "none" {
		return fmt.Errorf("approximate=%q: only the exact (erf) GELU is supported", a)
	}
	return unary(func(*onnxpb.NodeProto) nn.Layer { return nn.GELU{} })(im, n)
}

func identity(im *importer, n *onnxpb.NodeProto) error {
	if c, ok := im.konst(0); ok {
		im.consts[n.GetOutput()[0]] = c
		return nil
	}
	v, err := im.act(0)
	if err != nil {
		return err
	}
	im.set(0, v)
	return nil
}

// arith adds Add, Sub, Mul or Div: of two values of one shape, of a value
// and a scalar constant, or (Add, Mul) of a value and a parameter that
// broadcasts along the channels or features.
func arith(op string) func(*importer, *onnxpb.NodeProto) error {
	return func(im *importer, n *onnxpb.NodeProto) error {
		if len(n.GetInput()) != 2 {
			return fmt.Errorf("%d operands, want 2", len(n.GetInput()))
		}
		a, errA := im.act(0)
		b, errB := im.act(1)
		switch {
		case errA == nil && errB == nil:
			if !slices.Equal(a.shape, b.shape) {
				return fmt.Errorf("operands of shapes %v and %v: broadcasting between values is not supported", a.shape, b.shape)
			}
			if a.cl != b.cl {
				var err error
				if a, err = im.channelsLast(a); err != nil {
					return err
				}
				if b, err = im.channelsLast(b); err != nil {
					return err
				}
			}
			var l nn.Layer = &nn.Binary{Op: op}
			if op == "add" {
				l = nn.Add{}
			}
			im.set(0, &value{name: im.add("", l, a, b), shape: a.shape, cl: a.cl})
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
			if x, ok := c.scalar(); ok && (c.f != nil || !im.isInit(k)) {
				sop := op
				if swapped && (op == "sub" || op == "div") {
					sop = "r" + op
				}
				im.set(0, &value{name: im.add("", &nn.Scalar{Op: sop, C: x}, v), shape: v.shape, cl: v.cl})
				return nil
			}
			return im.channelParam(op, v, k, c)
		}
		if c, ok := im.fold2(op); ok {
			im.consts[n.GetOutput()[0]] = c
			return nil
		}
		return fmt.Errorf("no operand is computed from the data")
	}
}

func (im *importer) isInit(i int) bool {
	if i >= len(im.node.GetInput()) {
		return false
	}
	_, ok := im.inits[im.node.GetInput()[i]]
	return ok
}

// channelParam adds a trainable per-channel (or per-feature) bias or scale.
func (im *importer) channelParam(op string, v *value, k int, c *constant) error {
	if op != "add" && op != "mul" || !im.isInit(k) {
		return fmt.Errorf("%s with a constant of shape %v: only scalars, and parameters added or multiplied per channel, are supported", op, c.shape)
	}
	// The parameter broadcasts along one axis: the last as stored.
	width := v.stored()[len(v.stored())-1]
	want := make([]int, len(v.shape))
	for i := range want {
		want[i] = 1
	}
	ax := len(v.shape) - 1
	if v.cl {
		ax = 0
	}
	want[ax] = width
	shape := slices.Clone(c.shape)
	for len(shape) > len(want) && shape[0] == 1 {
		shape = shape[1:]
	}
	for len(shape) < len(want) {
		shape = append([]int{1}, shape...)
	}
	if !slices.Equal(shape, want) {
		return fmt.Errorf("%s with a parameter of shape %v on values of shape %v: it must broadcast along the channels or features only", op, c.shape, v.shape)
	}
	c, name, err := im.param(k)
	if err != nil {
		return err
	}
	if op == "add" {
		l := &nn.Bias{}
		im.set(0, &value{name: im.add("", l, v), shape: v.shape, cl: v.cl})
		im.give(l.B, name, c, width)
	} else {
		l := &nn.Scale{}
		im.set(0, &value{name: im.add("", l, v), shape: v.shape, cl: v.cl})
		im.give(l.W, name, c, width)
	}
	return nil
}

// fold2 computes an elementwise operation of two integer constants (shape
// arithmetic).
func (im *importer) fold2(op string) (*constant, bool) {
	a, okA := im.konst(0)
	b, okB := im.konst(1)
	if !okA || !okB || a.f != nil || b.f != nil || a.size() != b.size() {
		return nil, false
	}
	out := &constant{shape: a.shape, i: make([]int64, a.size())}
	for j := range out.i {
		x, y := a.i[j], b.i[j]
		if x == batchDim || y == batchDim {
			return nil, false
		}
		switch op {
		case "add":
			out.i[j] = x + y
		case "sub":
			out.i[j] = x - y
		case "mul":
			out.i[j] = x * y
		case "div":
			if y == 0 {
				return nil, false
			}
			out.i[j] = x / y
		}
	}
	return out, true
}

func gemm(im *importer, n *onnxpb.NodeProto) error {
	if attrFloat(n, "alpha", 1) != 1 || attrFloat(n, "beta", 1) != 1 || attrInt(n, "transA", 0) != 0 {
		return fmt.Errorf("only alpha=1, beta=1, transA=0 are supported (torch.nn.Linear's export)")
	}
	x, err := im.act(0)
	if err != nil {
		return err
	}
	w, wn, err := im.param(1, 2)
	if err != nil {
		return err
	}
	return im.linear(x, w, wn, attrInt(n, "transB", 0) != 0, 2)
}

func matmul(im *importer, n *onnxpb.NodeProto) error {
	x, err := im.act(0)
	if err != nil {
		return err
	}
	if _, err := im.act(1); err == nil {
		return fmt.Errorf("a product of two values is not supported; the second operand must be a parameter")
	}
	w, wn, err := im.param(1, 2)
	if err != nil {
		return err
	}
	return im.linear(x, w, wn, false, -1)
}

// linear adds x·W (transB: x·Wᵀ, W as torch.nn.Linear's [out, in]) with the
// bias of input biasIn (-1 or missing: none).
func (im *importer) linear(x *value, w *constant, wn string, transB bool, biasIn int) error {
	if len(x.shape) != 1 {
		return fmt.Errorf("input of per-sample shape %v; a product takes flat features (add a Flatten)", x.shape)
	}
	in, out := w.shape[0], w.shape[1]
	if transB {
		in, out = out, in
	}
	if x.shape[0] != in {
		return fmt.Errorf("input has %d features, the weight %q is %v", x.shape[0], wn, w.shape)
	}
	l := &nn.Linear{In: in, Out: out, Transposed: !transB}
	var b *constant
	var bn string
	if biasIn >= 0 && biasIn < len(im.node.GetInput()) && im.node.GetInput()[biasIn] != "" {
		var err error
		if b, bn, err = im.param(biasIn, 1, 2); err != nil {
			return err
		}
		if b.size() != out {
			return fmt.Errorf("bias %q has shape %v for %d outputs", bn, b.shape, out)
		}
	} else {
		l.NoBias = true
	}
	im.set(0, &value{name: im.add("", l, x), shape: []int{out}})
	im.give(l.W, wn, w)
	if b != nil {
		im.give(l.B, bn, b, out)
	}
	return nil
}

// geometry reads a 2-D window's kernel, strides, pads and dilations.
func geometry(n *onnxpb.NodeProto, kernel []int) (strides, pads, dilations []int, err error) {
	if ap := attrString(n, "auto_pad", "NOTSET"); ap != "NOTSET" && ap != "VALID" {
		return nil, nil, nil, fmt.Errorf("auto_pad=%s is not supported; export with explicit padding", ap)
	}
	get := func(name string, def []int64, lo int64, count int) ([]int, error) {
		v, ok := attrInts(n, name)
		if !ok {
			v = def
		}
		if len(v) != count {
			return nil, fmt.Errorf("%s=%v: want %d values (2-D windows only)", name, v, count)
		}
		return small(v, lo)
	}
	if strides, err = get("strides", []int64{1, 1}, 1, 2); err != nil {
		return
	}
	if pads, err = get("pads", []int64{0, 0, 0, 0}, 0, 4); err != nil {
		return
	}
	dilations, err = get("dilations", []int64{1, 1}, 1, 2)
	return
}

func conv(im *importer, n *onnxpb.NodeProto) error {
	x, err := im.act(0)
	if err != nil {
		return err
	}
	w, wn, err := im.param(1)
	if err != nil {
		return err
	}
	if len(w.shape) != 4 || len(x.shape) != 3 {
		return fmt.Errorf("weight %v on input %v: only 2-D convolutions are supported", w.shape, x.shape)
	}
	groups := int(attrInt(n, "group", 1))
	o, ig, kh, kw := w.shape[0], w.shape[1], w.shape[2], w.shape[3]
	if k, ok := attrInts(n, "kernel_shape"); ok && !slices.Equal(k, []int64{int64(kh), int64(kw)}) {
		return fmt.Errorf("kernel_shape %v and weight %v disagree", k, w.shape)
	}
	if groups < 1 || ig*groups != x.shape[0] || o%groups != 0 {
		return fmt.Errorf("weight %v with %d groups on %d input channels", w.shape, groups, x.shape[0])
	}
	strides, pads, dil, err := geometry(n, []int{kh, kw})
	if err != nil {
		return err
	}
	var b *constant
	var bn string
	if len(n.GetInput()) > 2 && n.GetInput()[2] != "" {
		if b, bn, err = im.param(2, 1); err != nil {
			return err
		}
		if b.size() != o {
			return fmt.Errorf("bias %q has shape %v for %d channels", bn, b.shape, o)
		}
	}
	if x, err = im.channelsLast(x); err != nil {
		return err
	}
	l := &nn.Conv2D{In: x.shape[0], Out: o, KH: kh, KW: kw, SH: strides[0], SW: strides[1],
		PadT: pads[0], PadL: pads[1], PadB: pads[2], PadR: pads[3], DH: dil[0], DW: dil[1],
		Groups: groups, Bias: b != nil}
	name := im.add("", l, x)
	out := im.b.Shape(name)
	if out == nil {
		return nil // the builder's error is returned at the end
	}
	im.set(0, &value{name: name, shape: []int{out[2], out[0], out[1]}, cl: true})
	im.give(l.W, wn, w)
	if b != nil {
		im.give(l.B, bn, b, o)
	}
	return nil
}

func batchNorm(im *importer, n *onnxpb.NodeProto) error {
	x, err := im.act(0)
	if err != nil {
		return err
	}
	if err := im.noUse(1); err != nil {
		return err
	}
	switch len(x.shape) {
	case 1:
	case 3:
		if x, err = im.channelsLast(x); err != nil {
			return err
		}
	default:
		return fmt.Errorf("input of per-sample shape %v: BatchNorm1d/2d on [C] or [C, H, W] only", x.shape)
	}
	ch := x.stored()[len(x.stored())-1]
	var cs [4]*constant
	var names [4]string
	for i := range cs {
		if cs[i], names[i], err = im.param(1+i, 1); err != nil {
			return err
		}
		if cs[i].size() != ch {
			return fmt.Errorf("%q has shape %v for %d channels", names[i], cs[i].shape, ch)
		}
	}
	l := nn.NewBatchNorm()
	l.Eps = shortest(attrFloat(n, "epsilon", 1e-5))
	// ONNX's momentum weighs the running value, PyTorch's the new one.
	l.Momentum = math.Round((1-shortest(attrFloat(n, "momentum", 0.9)))*1e9) / 1e9
	im.set(0, &value{name: im.add("", l, x), shape: x.shape, cl: x.cl})
	for i, p := range []*nn.Param{l.Weight, l.Bias, l.RunMean, l.RunVar} {
		if p != nil {
			im.give(p, names[i], cs[i])
		}
	}
	return nil
}

// shortest is the float64 of f's shortest decimal form (1e-5, not
// 9.99999974737875e-06).
func shortest(f float32) float64 {
	v, _ := strconv.ParseFloat(strconv.FormatFloat(float64(f), 'g', -1, 32), 64)
	return v
}

func pool(im *importer, n *onnxpb.NodeProto) error {
	x, err := im.act(0)
	if err != nil {
		return err
	}
	if err := im.noUse(1); err != nil {
		return err
	}
	if attrInt(n, "ceil_mode", 0) != 0 || attrInt(n, "storage_order", 0) != 0 {
		return fmt.Errorf("ceil_mode and storage_order are not supported")
	}
	k, ok := attrInts(n, "kernel_shape")
	if !ok || len(k) != 2 {
		return fmt.Errorf("kernel_shape %v: 2-D windows only", k)
	}
	kernel, err := small(k, 1)
	if err != nil {
		return err
	}
	strides, pads, dil, err := geometry(n, kernel)
	if err != nil {
		return err
	}
	if dil[0] != 1 || dil[1] != 1 {
		return fmt.Errorf("dilated pooling is not supported")
	}
	if x, err = im.channelsLast(x); err != nil {
		return err
	}
	var l nn.Layer
	if n.GetOpType() == "MaxPool" {
		l = &nn.MaxPool2D{KH: kernel[0], KW: kernel[1], SH: strides[0], SW: strides[1],
			PadT: pads[0], PadL: pads[1], PadB: pads[2], PadR: pads[3]}
	} else {
		l = &nn.AvgPool2D{KH: kernel[0], KW: kernel[1], SH: strides[0], SW: strides[1],
			PadT: pads[0], PadL: pads[1], PadB: pads[2], PadR: pads[3],
			CountIncludePad: attrInt(n, "count_include_pad", 0) != 0}
	}
	name := im.add("", l, x)
	if out := im.b.Shape(name); out != nil {
		im.set(0, &value{name: name, shape: []int{out[2], out[0], out[1]}, cl: true})
	}
	return nil
}

func globalAvgPool(im *importer, n *onnxpb.NodeProto) error {
	x, err := im.act(0)
	if err != nil {
		return err
	}
	if x, err = im.channelsLast(x); err != nil {
		return err
	}
	c := x.shape[0]
	pooled := &value{name: im.add("", &nn.GlobalAvgPool{}, x), shape: []int{c}}
	im.set(0, &value{name: im.add("view", &nn.Reshape{Shape: []int{1, 1, c}}, pooled), shape: []int{c, 1, 1}, cl: true})
	return nil
}

func flatten(im *importer, n *onnxpb.NodeProto) error {
	x, err := im.act(0)
	if err != nil {
		return err
	}
	if a := attrInt(n, "axis", 1); a != 1 {
		return fmt.Errorf("axis=%d: only the per-sample flatten (axis 1) is supported", a)
	}
	if len(x.shape) == 1 {
		im.set(0, x)
		return nil
	}
	x = im.logical(x)
	im.set(0, &value{name: im.add("", nn.Flatten{}, x), shape: []int{nn.Size(x.shape)}})
	return nil
}

func reshape(im *importer, n *onnxpb.NodeProto) error {
	x, err := im.act(0)
	if err != nil {
		return err
	}
	c, ok := im.konst(1)
	if !ok {
		return fmt.Errorf("the shape must be a constant")
	}
	t, ok := c.ints()
	if !ok || len(t) < 1 || attrInt(n, "allowzero", 0) != 0 {
		return fmt.Errorf("shape %v: want integers, allowzero=0", c.shape)
	}
	switch t[0] {
	case batchDim, 0, -1:
	default:
		if t[0] != im.batch {
			return fmt.Errorf("shape %v changes the batch dimension", t)
		}
	}
	shape := make([]int, len(t)-1)
	infer := -1
	for i, d := range t[1:] {
		switch {
		case d == 0 && i < len(x.shape):
			shape[i] = x.shape[i]
		case d == -1 && infer < 0:
			infer = i
		case d >= 1 && d <= math.MaxInt32:
			shape[i] = int(d)
		default:
			return fmt.Errorf("shape %v is not supported", t)
		}
	}
	if infer >= 0 {
		rest := 1
		for i, d := range shape {
			if i != infer {
				rest *= d
			}
		}
		if rest == 0 || nn.Size(x.shape)%rest != 0 {
			return fmt.Errorf("shape %v does not fit %v", t, x.shape)
		}
		shape[infer] = nn.Size(x.shape) / rest
	}
	if nn.Size(shape) != nn.Size(x.shape) {
		return fmt.Errorf("shape %v does not fit per-sample shape %v", t, x.shape)
	}
	if slices.Equal(shape, x.shape) {
		im.set(0, x)
		return nil
	}
	x = im.logical(x)
	im.set(0, &value{name: im.add("", &nn.Reshape{Shape: shape}, x), shape: shape})
	return nil
}

func transpose(im *importer, n *onnxpb.NodeProto) error {
	x, err := im.act(0)
	if err != nil {
		return err
	}
	p, ok := attrInts(n, "perm")
	if !ok || len(p) != len(x.shape)+1 || p[0] != 0 {
		return fmt.Errorf("perm %v: only permutations of the per-sample axes are supported", p)
	}
	perm := make([]int, len(x.shape))
	seen := make([]bool, len(x.shape))
	for i, a := range p[1:] {
		if a < 1 || int(a) > len(x.shape) || seen[a-1] {
			return fmt.Errorf("perm %v", p)
		}
		perm[i], seen[a-1] = int(a-1), true
	}
	x = im.logical(x)
	shape := make([]int, len(perm))
	for i, a := range perm {
		shape[i] = x.shape[a]
	}
	im.set(0, &value{name: im.add("", &nn.Permute{Perm: perm}, x), shape: shape})
	return nil
}

func concat(im *importer, n *onnxpb.NodeProto) error {
	ins := n.GetInput()
	if _, err := im.act(0); err != nil {
		if c, ok := im.foldConcat(); ok {
			im.consts[n.GetOutput()[0]] = c
			return nil
		}
		return err
	}
	vs := make([]*value, len(ins))
	for i := range ins {
		v, err := im.act(i)
		if err != nil {
			return err
		}
		if vs[i] = v; len(v.shape) != len(vs[0].shape) {
			return fmt.Errorf("inputs of shapes %v and %v", vs[0].shape, v.shape)
		}
	}
	a, err := axis(attrInt(n, "axis", 1), len(vs[0].shape))
	if err != nil {
		return err
	}
	cl := len(vs[0].shape) == 3 && a == 0
	for i, v := range vs {
		if cl {
			if vs[i], err = im.channelsLast(v); err != nil {
				return err
			}
		} else {
			vs[i] = im.logical(v)
		}
		if !vs[i].lastAxis(a) {
			return fmt.Errorf("concatenation along axis %d of %v: only the channels or the last axis are supported", a+1, v.shape)
		}
	}
	shape := slices.Clone(vs[0].shape)
	shape[a] = 0
	for _, v := range vs {
		shape[a] += v.shape[a]
	}
	im.set(0, &value{name: im.add("", &nn.Concat{}, vs...), shape: shape, cl: cl})
	return nil
}

// foldConcat joins 1-D integer constants (shape arithmetic).
func (im *importer) foldConcat() (*constant, bool) {
	out := &constant{i: []int64{}}
	for i := range im.node.GetInput() {
		c, ok := im.konst(i)
		if !ok || c.f != nil || len(c.shape) > 1 {
			return nil, false
		}
		out.i = append(out.i, c.i...)
	}
	out.shape = []int{len(out.i)}
	return out, true
}

// sliceAxis checks that per-sample axis a of x is its last as stored and
// returns the axis' size.
func sliceAxis(x *value, a int) (int, error) {
	if !x.lastAxis(a) {
		return 0, fmt.Errorf("axis %d of %v: only the channels or the last axis can be split", a+1, x.shape)
	}
	return x.shape[a], nil
}

func split(im *importer, n *onnxpb.NodeProto) error {
	x, err := im.act(0)
	if err != nil {
		return err
	}
	a, err := axis(attrInt(n, "axis", 0), len(x.shape))
	if err != nil {
		return err
	}
	width, err := sliceAxis(x, a)
	if err != nil {
		return err
	}
	outs := n.GetOutput()
	var sizes []int64
	if c, ok := im.konst(1); ok {
		sizes, _ = c.ints()
	} else if s, ok := attrInts(n, "split"); ok {
		sizes = s
	} else {
		if len(outs) == 0 || width%len(outs) != 0 {
			return fmt.Errorf("%d features into %d outputs", width, len(outs))
		}
		for range outs {
			sizes = append(sizes, int64(width/len(outs)))
		}
	}
	if len(sizes) != len(outs) {
		return fmt.Errorf("split %v into %d outputs", sizes, len(outs))
	}
	from := 0
	for i, s := range sizes {
		if s < 1 || s > int64(width-from) {
			return fmt.Errorf("split %v of %d features", sizes, width)
		}
		to := from + int(s)
		shape := slices.Clone(x.shape)
		shape[a] = to - from
		im.set(i, &value{name: im.add(fmt.Sprint(i), &nn.Slice{From: from, To: to}, x), shape: shape, cl: x.cl})
		from = to
	}
	if from != width {
		return fmt.Errorf("split %v of %d features", sizes, width)
	}
	return nil
}

func slice(im *importer, n *onnxpb.NodeProto) error {
	var starts, ends, axes, steps []int64
	if im.opset < 10 {
		starts, _ = attrInts(n, "starts")
		ends, _ = attrInts(n, "ends")
		axes, _ = attrInts(n, "axes")
	} else {
		get := func(i int) ([]int64, error) {
			if i >= len(n.GetInput()) || n.GetInput()[i] == "" {
				return nil, nil
			}
			c, ok := im.konst(i)
			if !ok {
				return nil, fmt.Errorf("input %d must be a constant", i)
			}
			v, ok := c.ints()
			if !ok {
				return nil, fmt.Errorf("input %d is not integer", i)
			}
			return v, nil
		}
		var err error
		for i, dst := range []*[]int64{&starts, &ends, &axes, &steps} {
			if *dst, err = get(i + 1); err != nil {
				return err
			}
		}
	}
	if c, ok := im.konst(0); ok && c.f == nil && len(c.shape) == 1 && len(starts) == 1 && (len(steps) == 0 || steps[0] == 1) {
		lo, hi := clampRange(starts[0], ends[0], len(c.i))
		im.consts[n.GetOutput()[0]] = &constant{shape: []int{hi - lo}, i: slices.Clone(c.i[lo:hi])}
		return nil
	}
	x, err := im.act(0)
	if err != nil {
		return err
	}
	if len(starts) != 1 || len(ends) != 1 || len(axes) > 1 || len(steps) > 1 || len(steps) == 1 && steps[0] != 1 {
		return fmt.Errorf("starts %v ends %v axes %v steps %v: one axis with step 1 only", starts, ends, axes, steps)
	}
	ax := int64(0)
	if len(axes) == 1 {
		ax = axes[0]
	}
	a, err := axis(ax, len(x.shape))
	if err != nil {
		return err
	}
	width, err := sliceAxis(x, a)
	if err != nil {
		return err
	}
	lo, hi := clampRange(starts[0], ends[0], width)
	if lo >= hi {
		return fmt.Errorf("empty slice [%d, %d) of %d", starts[0], ends[0], width)
	}
	shape := slices.Clone(x.shape)
	shape[a] = hi - lo
	if hi-lo == width {
		im.set(0, x)
		return nil
	}
	im.set(0, &value{name: im.add("", &nn.Slice{From: lo, To: hi}, x), shape: shape, cl: x.cl})
	return nil
}

// clampRange resolves ONNX slice bounds (negative from the end, clamped).
func clampRange(start, end int64, n int) (int, int) {
	fix := func(v int64) int {
		if v < 0 {
			v += int64(n)
		}
		return int(max(0, min(v, int64(n))))
	}
	return fix(start), fix(end)
}

func dropout(im *importer, n *onnxpb.NodeProto) error {
	x, err := im.act(0)
	if err != nil {
		return err
	}
	if err := im.noUse(1); err != nil {
		return err
	}
	ratio, train := attrFloat(n, "ratio", 0.5), false
	if c, ok := im.konst(1); ok {
		if ratio, ok = c.scalar(); !ok {
			return fmt.Errorf("ratio of shape %v", c.shape)
		}
	}
	if c, ok := im.konst(2); ok {
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
	im.set(0, &value{name: im.add("", nn.NewDropout(float64(ratio)), x), shape: x.shape, cl: x.cl})
	return nil
}

func softmax(log bool) func(*importer, *onnxpb.NodeProto) error {
	return func(im *importer, n *onnxpb.NodeProto) error {
		x, err := im.act(0)
		if err != nil {
			return err
		}
		def := int64(-1)
		if im.opset < 13 {
			def = 1
			if len(x.shape) != 1 {
				return fmt.Errorf("opset %d's softmax flattens; export with opset 13 or later", im.opset)
			}
		}
		a, err := axis(attrInt(n, "axis", def), len(x.shape))
		if err != nil {
			return err
		}
		if !x.lastAxis(a) {
			x = im.logical(x)
			if !x.lastAxis(a) {
				return fmt.Errorf("softmax along axis %d of %v: only the last axis is supported", a+1, x.shape)
			}
		}
		var l nn.Layer = nn.Softmax{}
		if log {
			l = nn.LogSoftmax{}
		}
		im.set(0, &value{name: im.add("", l, x), shape: x.shape, cl: x.cl})
		return nil
	}
}

func constantOp(im *importer, n *onnxpb.NodeProto) error {
	for _, a := range n.GetAttribute() {
		var c *constant
		switch a.GetName() {
		case "value":
			var err error
			if c, err = tensorOf(a.GetT()); err != nil {
				return err
			}
		case "value_float":
			c = &constant{f: []float32{a.GetF()}}
		case "value_floats":
			c = &constant{shape: []int{len(a.GetFloats())}, f: slices.Clone(a.GetFloats())}
		case "value_int":
			c = &constant{i: []int64{a.GetI()}}
		case "value_ints":
			c = &constant{shape: []int{len(a.GetInts())}, i: slices.Clone(a.GetInts())}
		default:
			return fmt.Errorf("attribute %s is not supported", a.GetName())
		}
		im.consts[n.GetOutput()[0]] = c
		return nil
	}
	return fmt.Errorf("no value")
}

// shapeOp gives a value's shape as a constant, its batch dimension marked.
func shapeOp(im *importer, n *onnxpb.NodeProto) error {
	x, err := im.act(0)
	if err != nil {
		return err
	}
	s := []int64{batchDim}
	for _, d := range x.shape {
		s = append(s, int64(d))
	}
	lo, hi := clampRange(attrInt(n, "start", 0), attrInt(n, "end", int64(len(s))), len(s))
	s = s[lo:max(lo, hi)]
	im.consts[n.GetOutput()[0]] = &constant{shape: []int{len(s)}, i: s}
	return nil
}

func gather(im *importer, n *onnxpb.NodeProto) error {
	c, ok1 := im.konst(0)
	idx, ok2 := im.konst(1)
	if !ok1 || !ok2 || c.f != nil || len(c.shape) != 1 || attrInt(n, "axis", 0) != 0 {
		return fmt.Errorf("only gathers from 1-D integer constants (shape arithmetic) are supported")
	}
	is, ok := idx.ints()
	if !ok {
		return fmt.Errorf("indices are not integers")
	}
	out := &constant{shape: slices.Clone(idx.shape), i: make([]int64, len(is))}
	for j, k := range is {
		if k < 0 {
			k += int64(len(c.i))
		}
		if k < 0 || k >= int64(len(c.i)) {
			return fmt.Errorf("index %d of %d", is[j], len(c.i))
		}
		out.i[j] = c.i[k]
	}
	im.consts[n.GetOutput()[0]] = out
	return nil
}

func unsqueeze(im *importer, n *onnxpb.NodeProto) error {
	c, ok := im.konst(0)
	if !ok {
		return fmt.Errorf("only unsqueezing constants (shape arithmetic) is supported; use Reshape or Flatten on values")
	}
	axes, ok := attrInts(n, "axes")
	if a, k := im.konst(1); k {
		axes, ok = a.ints()
	}
	if !ok || len(c.shape)+len(axes) > 8 {
		return fmt.Errorf("axes %v", axes)
	}
	// Shape arithmetic needs the values in order, not the added axes.
	im.consts[n.GetOutput()[0]] = &constant{shape: []int{c.size()}, f: c.f, i: c.i}
	return nil
}

func cast(im *importer, n *onnxpb.NodeProto) error {
	if c, ok := im.konst(0); ok {
		im.consts[n.GetOutput()[0]] = c
		return nil
	}
	x, err := im.act(0)
	if err != nil {
		return err
	}
	if to := onnxpb.TensorProto_DataType(attrInt(n, "to", 0)); to != onnxpb.TensorProto_FLOAT {
		return fmt.Errorf("cast of a value to %s: ppnode computes in float32", to)
	}
	im.set(0, x)
	return nil
}

// pad adds zero padding of a feature map's height and width.
func pad(im *importer, n *onnxpb.NodeProto) error {
	x, err := im.act(0)
	if err != nil {
		return err
	}
	if m := attrString(n, "mode", "constant"); m != "constant" {
		return fmt.Errorf("mode %q: only zero padding is supported", m)
	}
	ps, ok := attrInts(n, "pads")
	if c, k := im.konst(1); k {
		ps, ok = c.ints()
	}
	if c, k := im.konst(2); k {
		if v, _ := c.scalar(); v != 0 {
			return fmt.Errorf("padding value %v: only zeros are supported", v)
		}
	}
	if !ok || len(ps) != 8 || len(x.shape) != 3 || ps[0] != 0 || ps[1] != 0 || ps[4] != 0 || ps[5] != 0 {
		return fmt.Errorf("pads %v of %v: only the height and width of a feature map can be padded", ps, x.shape)
	}
	p, err := small([]int64{ps[2], ps[3], ps[6], ps[7]}, 0)
	if err != nil {
		return err
	}
	if x, err = im.channelsLast(x); err != nil {
		return err
	}
	l := &nn.Pad2D{Top: p[0], Left: p[1], Bottom: p[2], Right: p[3]}
	shape := []int{x.shape[0], x.shape[1] + p[0] + p[2], x.shape[2] + p[1] + p[3]}
	im.set(0, &value{name: im.add("", l, x), shape: shape, cl: true})
	return nil
}
