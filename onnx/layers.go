package onnx

import (
	"fmt"
	"math"
	"slices"
	"strconv"

	"github.com/ppnode/ppnode/nn"
	"github.com/ppnode/ppnode/onnx/onnxpb"
)

// Operators that become layers with weights.

// weight2 returns the initializer that the rank-2 constant k is, and
// whether k is its transpose.
func (im *importer) weight2(k *konst) (int, bool, error) {
	if len(k.shape) != 2 || !k.trainable() {
		return 0, false, fmt.Errorf("the weight of shape %v must be a parameter of the module (an initializer)", k.shape)
	}
	if id, ok := im.whole(k, nil); ok {
		return id, false, nil
	}
	if id, ok := im.whole(k, []int{1, 0}); ok {
		return id, true, nil
	}
	return 0, false, fmt.Errorf("the weight is a part or rearrangement of a parameter that ppnode cannot train")
}

// linear adds x·W (W of shape [in, out]) on the last axis of x, with the
// bias konst b if set. A W that is rows [lo, hi) of a larger initializer,
// taken transposed (cross-attention's query or key-value projection out
// of in_proj_weight), is the product with the whole initializer, of which
// the model reads outputs [lo, hi): the layer holds a copy of it, tied to
// the other layers that read it.
func (im *importer) linear(x *value, w, b *konst) error {
	if x.isInt {
		return fmt.Errorf("a product of integers")
	}
	id, transposed, err := im.weight2(w)
	lo, hi := 0, 0 // hi > 0: the outputs [lo, hi) of the whole product
	if err != nil {
		var ok bool
		if id, lo, hi, ok = im.rows(w); !ok {
			return err
		}
		transposed = true
	}
	r := x.rank()
	if x, err = im.lastDims(x, r-1); err != nil {
		return err
	}
	in, out := w.shape[0], w.shape[1]
	if int64(in) != x.dim(r-1).c {
		return fmt.Errorf("input has %v features, the weight %q is %v", x.dim(r-1), im.inits[id].name, w.shape)
	}
	if hi > 0 {
		out = im.inits[id].k.shape[0]
	}
	name := im.layerName(im.node.GetName(), "")
	im.train(id, name)
	// The file's tensor is [out, in] (torch.nn.Linear) when the product
	// takes its transpose.
	l := &nn.Linear{In: in, Out: out, Transposed: !transposed, Last: len(x.stored) > 1}
	var bid int
	if b != nil {
		var ok bool
		if hi > 0 {
			bid, ok = im.part(b, lo, out)
		} else {
			bid, ok = im.whole(b, nil)
		}
		if !ok || b.size() != w.shape[1] {
			return fmt.Errorf("the bias of shape %v for %d outputs must be a parameter", b.shape, w.shape[1])
		}
		im.train(bid, name)
	} else {
		l.NoBias = true
	}
	y := im.b.Add(name, l, x.name)
	if hi > 0 {
		y = im.b.Add(im.layerName(name, "rows"), &nn.Slice{From: lo, To: hi}, y)
	}
	dims := slices.Clone(x.dims)
	im.set(0, im.newValue(y, dims, false))
	im.give(l.W, id)
	if b != nil {
		im.give(l.B, bid, out)
	}
	return nil
}

// part returns the 1-D initializer of n elements whose elements from lo
// on the 1-D konst k is.
func (im *importer) part(k *konst, lo, n int) (int, bool) {
	if len(k.shape) != 1 || len(k.src) == 0 || k.src[0] < 0 || k.src[0]&bufferBit != 0 {
		return 0, false
	}
	id := int(k.src[0] >> 32)
	if in := im.inits[id].k; len(in.shape) != 1 || in.shape[0] != n || lo+k.shape[0] > n {
		return 0, false
	}
	for e, s := range k.src {
		if s != int64(id)<<32|int64(lo+e) {
			return 0, false
		}
	}
	return id, true
}

func gemm(im *importer, n *onnxpb.NodeProto) error {
	if attrFloat(n, "alpha", 1) != 1 || attrFloat(n, "beta", 1) != 1 || attrInt(n, "transA", 0) != 0 {
		return fmt.Errorf("only alpha=1, beta=1, transA=0 are supported (torch.nn.Linear's export)")
	}
	x, err := im.val(0)
	if err != nil {
		return err
	}
	w, ok := im.konst(1)
	if !ok {
		return fmt.Errorf("the weight must be a parameter")
	}
	if attrInt(n, "transB", 0) != 0 {
		if w, err = w.transpose([]int{1, 0}); err != nil {
			return err
		}
	}
	var b *konst
	if im.has(2) {
		if b, ok = im.konst(2); !ok {
			return fmt.Errorf("the bias must be a parameter")
		}
	}
	return im.linear(x, w, b)
}

func matmul(im *importer, n *onnxpb.NodeProto) error {
	a, err := im.val(0)
	if err != nil {
		return err
	}
	if w, ok := im.konst(1); ok {
		if len(w.shape) != 2 {
			return fmt.Errorf("a product with a constant of shape %v", w.shape)
		}
		return im.linear(a, w, nil)
	}
	b, err := im.val(1)
	if err != nil {
		return err
	}
	return im.batchMatMul(a, b)
}

// fusedLinear is MatMul then Add of a bias (see fuse).
func fusedLinear(im *importer, n *onnxpb.NodeProto) error {
	x, errX := im.val(0)
	w, okW := im.konst(1)
	b, okB := im.konst(2)
	if errX == nil && okW && okB && len(w.shape) == 2 && len(b.shape) == 1 && w.trainable() && b.trainable() {
		if _, _, err := im.weight2(w); err == nil {
			return im.linear(x, w, b)
		}
	}
	return im.runUnfused(n)
}

// runUnfused adds a fused node's original nodes.
func (im *importer) runUnfused(n *onnxpb.NodeProto) error {
	for _, o := range im.unfused[n] {
		im.node = o
		if err := im.run(o); err != nil {
			return fmt.Errorf("node %q (%s): %w", o.GetName(), o.GetOpType(), err)
		}
	}
	im.node = n
	return nil
}

// batchMatMul adds the product of two values [..., M, K]·[..., K, P] with
// the same leading axes.
func (im *importer) batchMatMul(a, b *value) error {
	ra, rb := a.rank(), b.rank()
	if ra < 2 || rb < 2 || ra != rb {
		return fmt.Errorf("a product of values of shapes %v and %v: both of two or more axes, the same number", a, b)
	}
	if a.isInt || b.isInt {
		return fmt.Errorf("a product of integers")
	}
	for d := 0; d < ra-2; d++ {
		if a.dim(d) != b.dim(d) {
			return fmt.Errorf("a product of values of shapes %v and %v: the leading axes differ", a, b)
		}
	}
	if a.dim(ra-1) != b.dim(rb-2) {
		return fmt.Errorf("a product of values of shapes %v and %v", a, b)
	}
	// Keep whichever order the last two axes have in storage (a transposed
	// view is a flag, not a copy).
	transA := before(a, ra-1, ra-2)
	transB := before(b, rb-1, rb-2)
	var err error
	if transA {
		a, err = im.lastDims(a, ra-1, ra-2)
	} else {
		a, err = im.lastDims(a, ra-2, ra-1)
	}
	if err != nil {
		return err
	}
	if transB {
		b, err = im.lastDims(b, rb-1, rb-2)
	} else {
		b, err = im.lastDims(b, rb-2, rb-1)
	}
	if err != nil {
		return err
	}
	// b's leading stored axes in a's order.
	lead := len(a.stored) - 2
	if len(b.stored)-2 != lead {
		return fmt.Errorf("a product of values of shapes %v and %v whose leading axes are stored differently", a, b)
	}
	order := make([]int, 0, len(b.stored))
	for x := 1; x <= lead; x++ {
		d, j := locate(a, x)
		bs := dropOnes(b, b.dims[d])
		as := dropOnes(a, a.dims[d])
		if len(bs) != len(as) {
			return fmt.Errorf("a product of values of shapes %v and %v whose leading axes are stored differently", a, b)
		}
		k := slices.Index(as, x)
		if k < 0 || j < 0 || bs[k] == 0 || b.axisSize(bs[k]) != a.axisSize(x) {
			return fmt.Errorf("a product of values of shapes %v and %v whose leading axes are stored differently", a, b)
		}
		order = append(order, bs[k])
	}
	if len(order) != lead {
		return fmt.Errorf("a product of values of shapes %v and %v whose leading axes are stored differently", a, b)
	}
	order = append(order, lead+1, lead+2)
	b = im.permute(b, order)
	name := im.add("", &nn.MatMul{TransA: transA, TransB: transB}, a, b)
	dims := slices.Clone(a.dims[:ra-2])
	dims = append(dims, []int{lead + 1}, []int{lead + 2})
	im.set(0, im.newValue(name, dims, false))
	return nil
}

// before reports whether ONNX axis x of v is stored before axis y (by
// their first stored axes; the batch counts as none).
func before(v *value, x, y int) bool {
	fx, fy := first(v, x), first(v, y)
	return fx >= 0 && fy >= 0 && fx < fy
}

func first(v *value, d int) int {
	for _, a := range v.dims[d] {
		if a != 0 && v.axisSize(a) != 1 {
			return a
		}
	}
	return -1
}

// locate finds the ONNX axis holding stored axis a, and a's place in it.
func locate(v *value, a int) (int, int) {
	for d, as := range v.dims {
		if j := slices.Index(as, a); j >= 0 {
			return d, j
		}
	}
	return -1, -1
}

// embedding adds Gather(weight, ids): the rows of a parameter at ids
// computed from the data.
func embedding(im *importer, n *onnxpb.NodeProto, w *konst) error {
	ids, err := im.val(1)
	if err != nil {
		return fmt.Errorf("indices: %v", err)
	}
	if attrInt(n, "axis", 0) != 0 {
		return fmt.Errorf("a gather from a parameter along axis %d (an embedding takes rows)", attrInt(n, "axis", 0))
	}
	if !ids.isInt {
		return fmt.Errorf("indices are not integers")
	}
	if len(w.shape) != 2 || !w.trainable() {
		return fmt.Errorf("an embedding table of shape %v must be a parameter of the module", w.shape)
	}
	id, ok := im.whole(w, nil)
	if !ok {
		return fmt.Errorf("the embedding table must be a whole parameter")
	}
	name := im.layerName(im.node.GetName(), "")
	im.train(id, name)
	l := &nn.Embedding{Num: w.shape[0], Dim: w.shape[1]}
	out := im.b.Add(name, l, ids.name)
	dims := slices.Clone(ids.dims)
	dims = append(dims, []int{len(ids.stored) + 1})
	im.set(0, im.newValue(out, dims, false))
	im.give(l.W, id)
	return nil
}

// geometry reads a 2-D window's strides, pads and dilations.
// geometry reads a window's strides, pads and dilations over its spatial
// axes (1 or 2), in the 2-D form: a 1-D window is one of height 1.
func geometry(n *onnxpb.NodeProto, spatial int) (strides, pads, dilations []int, err error) {
	if ap := attrString(n, "auto_pad", "NOTSET"); ap != "NOTSET" && ap != "VALID" {
		return nil, nil, nil, fmt.Errorf("auto_pad=%s is not supported; export with explicit padding", ap)
	}
	get := func(name string, def int64, lo int64, count int) ([]int, error) {
		v, ok := attrInts(n, name)
		if !ok {
			v = slices.Repeat([]int64{def}, count)
		}
		if len(v) != count {
			return nil, fmt.Errorf("%s=%v: want %d values (1-D and 2-D windows only)", name, v, count)
		}
		return small(v, lo)
	}
	if strides, err = get("strides", 1, 1, spatial); err != nil {
		return
	}
	if pads, err = get("pads", 0, 0, 2*spatial); err != nil {
		return
	}
	if dilations, err = get("dilations", 1, 1, spatial); err != nil {
		return
	}
	if spatial == 1 {
		strides, pads, dilations = []int{1, strides[0]}, []int{0, pads[0], 0, pads[1]}, []int{1, dilations[0]}
	}
	return
}

// spatial returns an [N, C, H, W] or [N, C, L] value stored channels-last,
// [H, W, C] or [1, L, C], and its number of spatial axes.
func (im *importer) spatial(v *value) (*value, int, error) {
	if v.rank() != 3 {
		v, err := im.image(v)
		return v, 2, err
	}
	if v.isInt {
		return nil, 0, fmt.Errorf("a sequence of integers")
	}
	w, err := im.layout(v, 2, 1)
	if err != nil {
		return nil, 0, err
	}
	return im.reshapeStored(w, []int{1, w.stored[0], w.stored[1]}, [][]int{{0}, {3}, {2}}), 1, nil
}

// spatialOut is the value of a layer whose output is stored [H, W, C]
// (spatial 2) or [1, L, C] (spatial 1).
func (im *importer) spatialOut(name string, spatial int) *value {
	if spatial == 1 {
		return im.newValue(name, [][]int{{0}, {3}, {2}}, false)
	}
	return im.imageOut(name)
}

// image returns a plain [N, C, H, W] value stored channels-last.
func (im *importer) image(v *value) (*value, error) {
	if v.rank() != 4 {
		return nil, fmt.Errorf("input of shape %v; want [N, C, H, W]", v)
	}
	if v.isInt {
		return nil, fmt.Errorf("an image of integers")
	}
	return im.layout(v, 2, 3, 1)
}

// imageOut is the value of a layer whose output is stored [N, H, W, C].
func (im *importer) imageOut(name string) *value {
	return im.newValue(name, [][]int{{0}, {3}, {1}, {2}}, false)
}

// convWeights reads a convolution's weight and bias initializers.
func (im *importer) convWeights(layer string, rank int) (w *konst, wid int, b *konst, bid int, err error) {
	k, ok := im.konst(1)
	if !ok || len(k.shape) != rank || !k.trainable() {
		return nil, 0, nil, 0, fmt.Errorf("the weight must be a parameter of %d dimensions", rank)
	}
	if wid, ok = im.whole(k, nil); !ok {
		return nil, 0, nil, 0, fmt.Errorf("the weight must be a whole parameter")
	}
	im.train(wid, layer)
	if im.has(2) {
		if b, ok = im.konst(2); !ok || len(b.shape) != 1 || !b.trainable() {
			return nil, 0, nil, 0, fmt.Errorf("the bias must be a parameter of one dimension")
		}
		if bid, ok = im.whole(b, nil); !ok {
			return nil, 0, nil, 0, fmt.Errorf("the bias must be a whole parameter")
		}
		im.train(bid, layer)
	}
	return k, wid, b, bid, nil
}

func conv(im *importer, n *onnxpb.NodeProto) error {
	x, err := im.val(0)
	if err != nil {
		return err
	}
	x, sp, err := im.spatial(x)
	if err != nil {
		return fmt.Errorf("%v (only 1-D and 2-D convolutions are supported)", err)
	}
	name := im.layerName(n.GetName(), "")
	w, wid, b, bid, err := im.convWeights(name, 2+sp)
	if err != nil {
		return err
	}
	c := int(x.dim(1).c)
	groups := int(attrInt(n, "group", 1))
	o, ig, kh, kw := w.shape[0], w.shape[1], 1, w.shape[2]
	if sp == 2 {
		kh, kw = w.shape[2], w.shape[3]
	}
	if k, ok := attrInts(n, "kernel_shape"); ok && !slices.Equal(k, []int64{int64(kh), int64(kw)}[2-sp:]) {
		return fmt.Errorf("kernel_shape %v and weight %v disagree", k, w.shape)
	}
	if groups < 1 || ig*groups != c || o%groups != 0 {
		return fmt.Errorf("weight %v with %d groups on %d input channels", w.shape, groups, c)
	}
	if b != nil && b.size() != o {
		return fmt.Errorf("bias of shape %v for %d channels", b.shape, o)
	}
	strides, pads, dil, err := geometry(n, sp)
	if err != nil {
		return err
	}
	l := &nn.Conv2D{In: c, Out: o, KH: kh, KW: kw, SH: strides[0], SW: strides[1],
		PadT: pads[0], PadL: pads[1], PadB: pads[2], PadR: pads[3], DH: dil[0], DW: dil[1],
		Groups: groups, Bias: b != nil, OneD: sp == 1}
	out := im.b.Add(name, l, x.name)
	im.set(0, im.spatialOut(out, sp))
	im.give(l.W, wid)
	if b != nil {
		im.give(l.B, bid, o)
	}
	return nil
}

func convTranspose(im *importer, n *onnxpb.NodeProto) error {
	x, err := im.val(0)
	if err != nil {
		return err
	}
	x, sp, err := im.spatial(x)
	if err != nil {
		return fmt.Errorf("%v (only 1-D and 2-D transposed convolutions are supported)", err)
	}
	name := im.layerName(n.GetName(), "")
	w, wid, b, bid, err := im.convWeights(name, 2+sp)
	if err != nil {
		return err
	}
	c := int(x.dim(1).c)
	groups := int(attrInt(n, "group", 1))
	in, og, kh, kw := w.shape[0], w.shape[1], 1, w.shape[2]
	if sp == 2 {
		kh, kw = w.shape[2], w.shape[3]
	}
	if in != c || groups < 1 || in%groups != 0 {
		return fmt.Errorf("weight %v with %d groups on %d input channels", w.shape, groups, c)
	}
	o := og * groups
	if b != nil && b.size() != o {
		return fmt.Errorf("bias of shape %v for %d channels", b.shape, o)
	}
	if _, ok := attrInts(n, "output_shape"); ok {
		return fmt.Errorf("output_shape is not supported; export with explicit padding")
	}
	strides, pads, dil, err := geometry(n, sp)
	if err != nil {
		return err
	}
	op := []int{0, 0}
	if v, ok := attrInts(n, "output_padding"); ok {
		if op, err = small(v, 0); err != nil || len(op) != sp {
			return fmt.Errorf("output_padding %v", v)
		}
		if sp == 1 {
			op = []int{0, op[0]}
		}
	}
	l := &nn.ConvTranspose2D{In: c, Out: o, KH: kh, KW: kw, SH: strides[0], SW: strides[1],
		PadT: pads[0], PadL: pads[1], PadB: pads[2], PadR: pads[3], OutPadH: op[0], OutPadW: op[1],
		DH: dil[0], DW: dil[1], Groups: groups, Bias: b != nil, OneD: sp == 1}
	out := im.b.Add(name, l, x.name)
	im.set(0, im.spatialOut(out, sp))
	im.give(l.W, wid)
	if b != nil {
		im.give(l.B, bid, o)
	}
	return nil
}

func batchNorm(im *importer, n *onnxpb.NodeProto) error {
	x, err := im.val(0)
	if err != nil {
		return err
	}
	if err := im.noUse(1); err != nil {
		return err
	}
	switch x.rank() {
	case 2:
		x, err = im.layout(x, 1)
	case 3:
		x, err = im.layout(x, 2, 1)
	case 4:
		x, err = im.image(x)
	default:
		return fmt.Errorf("input of shape %v: BatchNorm1d/2d on [N, C], [N, C, L] or [N, C, H, W] only", x)
	}
	if err != nil {
		return err
	}
	name := im.layerName(n.GetName(), "")
	ch := x.stored[len(x.stored)-1]
	var ids [4]int
	for i := range ids {
		k, ok := im.konst(1 + i)
		if !ok || k.size() != ch || len(k.shape) != 1 {
			return fmt.Errorf("input %d must be an initializer of %d values", 1+i, ch)
		}
		if ids[i], ok = im.whole(k, nil); !ok && i < 2 {
			return fmt.Errorf("input %d must be a whole parameter", 1+i)
		}
		if i >= 2 { // running statistics: the file may call them buffers
			in := n.GetInput()[1+i]
			id, ok := im.initID[in]
			if !ok {
				return fmt.Errorf("running statistics %q must be initializers", in)
			}
			ids[i] = id
		}
		im.train(ids[i], name)
	}
	l := nn.NewBatchNorm()
	l.Eps = shortest(attrFloat(n, "epsilon", 1e-5))
	// ONNX's momentum weighs the running value, PyTorch's the new one.
	l.Momentum = math.Round((1-shortest(attrFloat(n, "momentum", 0.9)))*1e9) / 1e9
	out := im.b.Add(name, l, x.name)
	im.set(0, im.newValue(out, slices.Clone(x.dims), false))
	for i, p := range []*nn.Param{l.Weight, l.Bias, l.RunMean, l.RunVar} {
		if p != nil {
			im.give(p, ids[i])
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

// layerNorm adds LayerNormalization (opset 17) or the fused opset-13
// decomposition, over the last axis.
func layerNorm(im *importer, n *onnxpb.NodeProto) error {
	x, err := im.val(0)
	if err != nil {
		return err
	}
	r := x.rank()
	eps := float64(attrFloat(n, "epsilon", 1e-5))
	fused := n.GetOpType() == "ppnode.LayerNorm"
	if fused {
		e, ok1 := im.konst(3)
		p, ok2 := im.konst(4)
		ev, ok3 := scalarOf(e, ok1)
		pv, ok4 := scalarOf(p, ok2)
		w, okW := im.konst(1)
		_, okB := im.konst(2)
		if !ok3 || !ok4 || pv != 2 || im.has(1) != im.has(2) || im.has(1) && (!okW || !okB || !w.trainable()) {
			return im.runUnfused(n)
		}
		im.freeze(e, p)
		eps = shortest(ev)
	} else {
		if a, err := normAxis(attrInt(n, "axis", -1), r); err != nil || a != r-1 {
			return fmt.Errorf("normalisation over axis %d: only the last axis is supported", attrInt(n, "axis", -1))
		}
		if err := im.noUse(1); err != nil {
			return err
		}
	}
	if x, err = im.lastDims(x, r-1); err != nil {
		return err
	}
	if x.isInt {
		return fmt.Errorf("a normalisation of integers")
	}
	D := int(x.dim(r - 1).c)
	name := im.layerName(n.GetName(), "")
	l := &nn.LayerNorm{Eps: eps, NoAffine: !im.has(1)}
	var ids [2]int
	for i := range ids {
		if !im.has(1 + i) {
			continue
		}
		k, ok := im.konst(1 + i)
		if !ok || k.size() != D {
			return fmt.Errorf("input %d must be a parameter of %d values", 1+i, D)
		}
		if ids[i], ok = im.whole(k, nil); !ok {
			return fmt.Errorf("input %d must be a whole parameter", 1+i)
		}
		im.train(ids[i], name)
	}
	if !fused && im.has(1) && !im.has(2) {
		return fmt.Errorf("a scale without a bias")
	}
	out := im.b.Add(name, l, x.name)
	im.set(0, im.newValue(out, slices.Clone(x.dims), false))
	if im.has(1) {
		im.give(l.W, ids[0], D)
		im.give(l.B, ids[1], D)
	}
	return nil
}

// instanceNorm adds InstanceNormalization, what PyTorch exports for
// nn.InstanceNorm and, on [N, groups, rest], nn.GroupNorm: each sample's
// channel normalised over its other axes (a LayerNorm over them, flattened),
// then the per-channel scale and bias, skipped where they are ones and
// zeros.
func instanceNorm(im *importer, n *onnxpb.NodeProto) error {
	x, err := im.val(0)
	if err != nil {
		return err
	}
	if x.rank() < 3 || x.isInt {
		return fmt.Errorf("input of shape %v: want [N, C, ...] of floats", x)
	}
	w, err := im.rowMajor(x)
	if err != nil {
		return err
	}
	c := w.stored[0]
	flat := im.reshapeStored(w, []int{c, prod(w.stored[1:])}, [][]int{{0}, {1}, {2}})
	ln := im.newValue(im.add("", &nn.LayerNorm{Eps: shortest(attrFloat(n, "epsilon", 1e-5)), NoAffine: true}, flat), flat.dims, false)
	y := im.reshapeStored(ln, w.stored, w.dims)
	shape := slices.Repeat([]int{1}, x.rank())
	shape[1] = c
	for i, op := range []string{"mul", "add"} {
		k, ok := im.konst(1 + i)
		if !ok || k.size() != c || len(k.shape) != 1 {
			return fmt.Errorf("input %d must be a constant of %d values", 1+i, c)
		}
		if u, ok := uniform(k); ok && !k.trainable() && u == float32(1-i) {
			im.freeze(k)
			continue // a GroupNorm's ones and zeros
		}
		kk, err := k.reshape(shape)
		if err != nil {
			return err
		}
		if y, err = im.withConst(op, y, kk, false); err != nil {
			return err
		}
	}
	im.set(0, y)
	return nil
}

func scalarOf(k *konst, ok bool) (float32, bool) {
	if !ok {
		return 0, false
	}
	return k.scalar()
}

func pool(im *importer, n *onnxpb.NodeProto) error {
	x, err := im.val(0)
	if err != nil {
		return err
	}
	if err := im.noUse(1); err != nil {
		return err
	}
	if attrInt(n, "storage_order", 0) != 0 {
		return fmt.Errorf("storage_order is not supported")
	}
	ceil := attrInt(n, "ceil_mode", 0) != 0
	if ceil && n.GetOpType() == "AveragePool" && attrInt(n, "count_include_pad", 0) != 0 {
		return fmt.Errorf("ceil_mode with count_include_pad is not supported")
	}
	x, sp, err := im.spatial(x)
	if err != nil {
		return err
	}
	k, ok := attrInts(n, "kernel_shape")
	if !ok || len(k) != sp {
		return fmt.Errorf("kernel_shape %v on an input of shape %v", k, x)
	}
	kernel, err := small(k, 1)
	if err != nil {
		return err
	}
	if sp == 1 {
		kernel = []int{1, kernel[0]}
	}
	strides, pads, dil, err := geometry(n, sp)
	if err != nil {
		return err
	}
	if dil[0] != 1 || dil[1] != 1 {
		return fmt.Errorf("dilated pooling is not supported")
	}
	if ceil {
		// The windows that ceil_mode adds at the end (those that start
		// inside the input or its padding before) see padding at the
		// end, which max and the average of what is not padding skip.
		for a := range 2 {
			in, k, st := x.stored[a], kernel[a], strides[a]
			span := in + pads[a] + pads[a+2] - k
			if span < 0 {
				break // the layer refuses the window
			}
			out := (span+st-1)/st + 1
			if (out-1)*st >= in+pads[a] {
				out--
			}
			pads[a+2] += max(0, (out-1)*st+k-(in+pads[a]+pads[a+2]))
		}
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
	im.set(0, im.spatialOut(im.add("", l, x), sp))
	return nil
}

func globalAvgPool(im *importer, n *onnxpb.NodeProto) error {
	x, err := im.val(0)
	if err != nil {
		return err
	}
	x, sp, err := im.spatial(x)
	if err != nil {
		return err
	}
	name := im.add("", &nn.GlobalAvgPool{}, x)
	// [N, C] stored: the pooled axes are of size 1, spanned by nothing.
	dims := [][]int{{0}, {1}, {}, {}}
	im.set(0, im.newValue(name, dims[:2+sp], false))
	return nil
}

func resize(im *importer, n *onnxpb.NodeProto) error {
	x, err := im.val(0)
	if err != nil {
		return err
	}
	x, sp, err := im.spatial(x) // [N, C, L] is an image of height 1
	if err != nil {
		return err
	}
	r := sp + 2
	mode := attrString(n, "mode", "nearest")
	ctm := attrString(n, "coordinate_transformation_mode", "half_pixel")
	l := &nn.Resize{}
	switch mode {
	case "nearest":
		if nm := attrString(n, "nearest_mode", "round_prefer_floor"); ctm != "asymmetric" || nm != "floor" {
			return fmt.Errorf("nearest resize with %s coordinates and %s rounding: ppnode does nn.Upsample's (asymmetric, floor)", ctm, nm)
		}
		l.Mode = "nearest"
	case "linear":
		switch ctm {
		case "pytorch_half_pixel", "half_pixel":
		case "align_corners":
			l.AlignCorners = true
		default:
			return fmt.Errorf("linear resize with %s coordinates is not supported", ctm)
		}
		l.Mode = "linear"
	default:
		return fmt.Errorf("mode %q: nearest and linear are supported", mode)
	}
	// Scales (input 2, or 1 in Upsample) or sizes (input 3), one per
	// axis; a 1-D resize's height stays 1.
	scaleIn := 2
	if n.GetOpType() == "Upsample" {
		scaleIn = 1
	}
	if k, ok := im.konst(scaleIn); ok && k.size() == r {
		im.freeze(k)
		f, _ := k.floats()
		if r == 3 {
			f = []float32{f[0], f[1], 1, f[2]}
		}
		if f[0] != 1 || f[1] != 1 || f[2] != float32(int(f[2])) || f[3] != float32(int(f[3])) || f[2] < 1 || f[3] < 1 || f[2] > 64 || f[3] > 64 {
			return fmt.Errorf("scales %v: whole factors of the spatial axes only", f)
		}
		l.ScaleH, l.ScaleW = int(f[2]), int(f[3])
	} else if k, ok := im.konst(3); ok && k.size() == r {
		im.freeze(k)
		s, ok := k.syms()
		if ok && r == 3 {
			s = []sym{s[0], s[1], {c: 1}, s[2]}
		}
		if !ok || s[1].n || s[1].c != x.dim(1).c || s[2].n || s[3].n || s[2].c < 1 || s[3].c < 1 || s[2].c > 1<<16 || s[3].c > 1<<16 {
			return fmt.Errorf("sizes %v", s)
		}
		l.OutH, l.OutW = int(s[2].c), int(s[3].c)
	} else {
		return fmt.Errorf("scales or sizes must be constants of %d values", r)
	}
	im.set(0, im.spatialOut(im.add("", l, x), sp))
	return nil
}

// rnn adds LSTM or GRU: PyTorch's nn.LSTM / nn.GRU, whose exporter
// builds the ONNX weights by reordering the gates of the module's
// parameters; the layer trains those parameters themselves.
func rnn(im *importer, n *onnxpb.NodeProto) error {
	x, err := im.val(0)
	if err != nil {
		return err
	}
	lstm, gru := n.GetOpType() == "LSTM", n.GetOpType() == "GRU"
	// reversed lists the directions: whether each runs backwards in time.
	var reversed []bool
	switch d := attrString(n, "direction", "forward"); d {
	case "forward":
		reversed = []bool{false}
	case "reverse":
		reversed = []bool{true}
	case "bidirectional":
		reversed = []bool{false, true}
	default:
		return fmt.Errorf("direction %s: want forward, reverse or bidirectional", d)
	}
	dirs := len(reversed)
	if attrInt(n, "layout", 0) != 0 || x.rank() != 3 || !slices.Equal(dropOnes(x, x.dims[1]), []int{0}) {
		return fmt.Errorf("input of shape %v: want [T, N, features] (layout 0, as PyTorch exports)", x)
	}
	if attrInt(n, "linear_before_reset", 0) != 1 && gru {
		return fmt.Errorf("linear_before_reset=0: PyTorch's GRU has 1")
	}
	relu := false // nn.RNN(nonlinearity="relu")
	if acts, ok := attrStrings(n, "activations"); ok {
		relu = len(acts) > 0 && acts[0] == "Relu"
		for _, a := range acts {
			if lstm || gru || a != acts[0] || a != "Tanh" && a != "Relu" {
				return fmt.Errorf("activations %v: only an RNN's Tanh or Relu", acts)
			}
		}
	}
	if im.has(4) {
		return fmt.Errorf("sequence lengths are not supported (pad sequences to one length)")
	}
	for i := 5; i < len(n.GetInput()); i++ {
		if !im.has(i) {
			continue
		}
		k, ok := im.konst(i)
		f, okf := []float32(nil), false
		if ok {
			f, okf = k.floats()
		}
		if ok && k.trainable() {
			return fmt.Errorf("a learned initial state (a parameter) is not supported")
		}
		if !ok || !okf || slices.ContainsFunc(f, func(v float32) bool { return v != 0 }) {
			return fmt.Errorf("initial states must be zero")
		}
		im.freeze(k)
	}
	H := int(attrInt(n, "hidden_size", 0))
	if H < 1 || H > 1<<16 {
		return fmt.Errorf("hidden_size %d", H)
	}
	// ONNX's gate order (LSTM i, o, f, c; GRU z, r, h) as PyTorch's blocks
	// (LSTM i, f, g, o; GRU r, z, n); an RNN has one.
	G, order := 1, []int{0}
	switch {
	case lstm:
		G, order = 4, []int{0, 3, 1, 2}
	case gru:
		G, order = 3, []int{1, 0, 2}
	}
	I := int(x.dim(2).c)
	W, okW := im.konst(1)
	R, okR := im.konst(2)
	B, okB := im.konst(3)
	if !okW || !okR || !okB {
		return fmt.Errorf("W, R and B must be constants (the module's parameters)")
	}
	name := im.layerName(n.GetName(), "")
	// which finds the PyTorch tensor that part of k is: k's element
	// (part·G·H + g·H + r)·cols + c is the tensor's ((order[g]·H + r)·cols + c).
	which := func(k *konst, size, cols, part int) (int, error) {
		if k.src == nil || k.size() != size {
			return 0, fmt.Errorf("weights of shape %v", k.shape)
		}
		id := -1
		for g := 0; g < G; g++ {
			for r := 0; r < H; r++ {
				for c := 0; c < cols; c++ {
					s := k.src[(part*G*H+g*H+r)*cols+c]
					if s < 0 {
						return 0, fmt.Errorf("weights that are not the module's parameters")
					}
					if id < 0 {
						id = int(s >> 32)
					}
					if s != int64(id)<<32|int64((order[g]*H+r)*cols+c) {
						return 0, fmt.Errorf("weights that are not the module's parameters in PyTorch's gate order")
					}
				}
			}
		}
		if sh := im.inits[id].k.shape; prod(sh) != G*H*cols {
			return 0, fmt.Errorf("parameter %q of shape %v", im.inits[id].name, sh)
		}
		return id, nil
	}
	// [T, N, I] stored [N, T, I].
	if x, err = im.lastDims(x, 0, 2); err != nil {
		return err
	}
	T := int(x.dim(0).c)
	back := make([]int, T) // the steps in reverse order
	for t := range back {
		back[t] = T - 1 - t
	}
	needY := im.readers[n.GetOutput()[0]] > 0
	needH := len(n.GetOutput()) > 1 && n.GetOutput()[1] != "" && im.readers[n.GetOutput()[1]] > 0
	if len(n.GetOutput()) > 2 && n.GetOutput()[2] != "" && im.readers[n.GetOutput()[2]] > 0 {
		return fmt.Errorf("the final cell state Y_c is not supported; use the outputs Y")
	}
	// Each direction is a layer over the steps in its order: a reverse one
	// reads them reversed and its output is reversed back. ys are the
	// outputs in step order, hs the last steps computed (Y_h).
	var ys, hs []*value
	for d, rev := range reversed {
		// W [dirs, G·H, I], R [dirs, G·H, H], B [dirs, 2·G·H]: direction d's
		// W and R are their part d, its biases parts 2d and 2d+1 of B.
		var ids [4]int
		for i, a := range []struct {
			k                *konst
			size, cols, part int
		}{{W, dirs * G * H * I, I, d}, {R, dirs * G * H * H, H, d}, {B, dirs * 2 * G * H, 1, 2 * d}, {B, dirs * 2 * G * H, 1, 2*d + 1}} {
			if ids[i], err = which(a.k, a.size, a.cols, a.part); err != nil {
				return err
			}
		}
		layer, in := name, x
		if rev {
			layer = im.layerName(n.GetName(), "reverse")
			in = im.newValue(im.add("flip", &nn.Take{Axis: 0, Index: back}, x), x.dims, false)
		}
		for _, id := range ids {
			im.train(id, layer)
		}
		var l nn.Layer = &nn.RNN{In: I, Hidden: H, ReLU: relu}
		switch {
		case lstm:
			l = &nn.LSTM{In: I, Hidden: H}
		case gru:
			l = &nn.GRU{In: I, Hidden: H}
		}
		out := im.b.Add(layer, l, in.name)
		for i, p := range l.Params() { // weight_ih, weight_hh, bias_ih, bias_hh, as ids
			if p != nil { // (nil if the layer did not build)
				im.give(p, ids[i])
			}
		}
		y := im.newValue(out, nil, false)
		if needH {
			hs = append(hs, im.newValue(im.add("last", &nn.Take{Axis: 0, Index: []int{T - 1}}, y), nil, false))
		}
		if rev && needY {
			y = im.newValue(im.add("unflip", &nn.Take{Axis: 0, Index: back}, y), nil, false)
		}
		ys = append(ys, y)
	}
	// Y is [T, directions, N, H]: stored [N, T, H], or [N, T, 2, H].
	switch {
	case !needY:
	case len(ys) == 1:
		im.set(0, im.newValue(ys[0].name, [][]int{{1}, {}, {0}, {2}}, false))
	default:
		both := im.newValue(im.add("directions", &nn.Concat{}, ys...), nil, false)
		im.set(0, im.reshapeStored(both, []int{T, 2, H}, [][]int{{1}, {2}, {0}, {3}}))
	}
	// Y_h [directions, N, H]: each direction's last step, stored [N, 1, H]
	// or [N, 2, H].
	switch {
	case !needH:
	case len(hs) == 1:
		im.set(1, im.newValue(hs[0].name, [][]int{{}, {0}, {2}}, false))
	default:
		im.set(1, im.newValue(im.add("states", &nn.Concat{Axis: 1}, hs...), [][]int{{1}, {0}, {2}}, false))
	}
	return nil
}
