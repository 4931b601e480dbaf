package onnx

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/ppnode/ppnode/nn"
	"github.com/ppnode/ppnode/onnx/onnxpb"
)

// Input describes one of the data's arrays.
type Input struct {
	// Name is the array's name in the data ("x", "x0", "dense", ...): a
	// model of several inputs takes each from the array of its name.
	Name string
	// Shape is a sample's shape. Besides the model's own shape, [H, W, C]
	// images (ppnode's built-in sets) feed a [C, H, W] input, and any shape
	// of the same size feeds an input of flat features.
	Shape []int
	// Int is set for integers (token ids, categories).
	Int bool
}

// Options describe the data a model will train on.
type Options struct {
	// Inputs are the data's arrays, in the data's order; the graph takes
	// its inputs in this order.
	Inputs []Input
}

// Model is an imported model.
type Model struct {
	// Graph's inputs are Options.Inputs', in their order.
	Graph *nn.Graph
	// Input is the model's per-sample shape of each input as the file
	// declares it.
	Input [][]int
	// ChannelAxes are, per input, the axis of a data sample that holds
	// channels, the axis standardisation works per (-1: an integer input,
	// not standardised).
	ChannelAxes []int
	// Classes is the size of the output's last axis: the classes when
	// they are there.
	Classes int
	// Labels is the per-sample shape of the targets: [] for one class a
	// sample (logits [N, classes]), [T] for one a position (a language
	// model's logits [N, T, classes]).
	Labels []int
}

// Supported lists the operators a model may use.
func Supported() []string {
	ops := make([]string, 0, len(handlers))
	for op := range handlers {
		if !strings.HasPrefix(op, "ppnode.") {
			ops = append(ops, op)
		}
	}
	sort.Strings(ops)
	return ops
}

// Read loads the model file at path and imports it.
func Read(path string, o Options) (*Model, error) {
	m, err := Load(path)
	if err != nil {
		return nil, err
	}
	md, err := Import(m, o)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return md, nil
}

// BuffersKey is the model metadata key that lists, comma-separated, the
// initializers that are buffers (constants that training must not change,
// such as a fixed position encoding). python/ppnode_models.py's export
// writes it; without it, an initializer that a layer uses as a weight is
// trained.
const BuffersKey = "ppnode.buffers"

// TiedKey is the model metadata key that lists the names a module's
// state_dict has for each tensor it holds under several (tied weights,
// which the file holds once): groups separated by commas, names within a
// group by "=". python/ppnode_models.py's export writes it; weights files
// then hold a tied tensor under each of its names, as the state_dict does.
const TiedKey = "ppnode.tied"

// Import turns a parsed model into a graph whose parameters start at the
// model's initializers. Every problem is an error wrapping ErrModel.
func Import(m *onnxpb.ModelProto, o Options) (*Model, error) {
	md, err := importModel(m, o)
	if err != nil && !errors.Is(err, ErrModel) {
		err = fmt.Errorf("%w: %w", ErrModel, err)
	}
	return md, err
}

func importModel(m *onnxpb.ModelProto, o Options) (md *Model, err error) {
	defer func() {
		// A file that reaches a case the importer does not foresee is
		// refused like any other bad file.
		if r := recover(); r != nil {
			md, err = nil, modelErr("the model could not be imported (%v); please report it with the file", r)
		}
	}()
	im := &importer{
		b: nn.NewBuilder(), vals: map[string]*value{}, consts: map[string]*konst{},
		initID: map[string]int{}, buffers: map[string]bool{}, trained: map[int]string{},
		frozen: map[int]bool{}, taken: map[string]bool{}, perRow: map[string]*batchRows{}, opset: 13,
	}
	for _, op := range m.GetOpsetImport() {
		if d := op.GetDomain(); d == "" || d == "ai.onnx" {
			im.opset = op.GetVersion()
		}
	}
	aliases := map[string][]string{}
	for _, p := range m.GetMetadataProps() {
		switch p.GetKey() {
		case BuffersKey:
			for _, n := range strings.Split(p.GetValue(), ",") {
				im.buffers[strings.TrimSpace(n)] = true
			}
		case TiedKey:
			for _, grp := range strings.Split(p.GetValue(), ",") {
				names := strings.Split(grp, "=")
				for _, n := range names {
					for _, a := range names {
						if a != n && a != "" {
							aliases[n] = append(aliases[n], a)
						}
					}
				}
			}
		}
	}
	g := m.GetGraph()
	for _, t := range g.GetInitializer() {
		c, err := tensorOf(t)
		if err != nil {
			return nil, err
		}
		if _, dup := im.initID[t.GetName()]; dup {
			return nil, modelErr("initializer %q twice", t.GetName())
		}
		id := len(im.inits)
		im.initID[t.GetName()] = id
		{
			var flag int64
			if im.buffers[t.GetName()] || c.kind != kFloat {
				flag = bufferBit
			}
			c.src = make([]int64, c.size())
			for e := range c.src {
				c.src[e] = int64(id)<<32 | int64(e) | flag
			}
		}
		im.inits = append(im.inits, initializer{name: t.GetName(), k: c})
		im.consts[t.GetName()] = c
	}
	// Refuse unsupported operators, all of them at once, before building.
	var missing []string
	where := map[string][]string{}
	for _, n := range g.GetNode() {
		op := n.GetOpType()
		if d := n.GetDomain(); d != "" && d != "ai.onnx" {
			op = d + "." + op
		}
		if _, ok := handlers[op]; !ok || strings.HasPrefix(op, "ppnode.") {
			if where[op] == nil {
				missing = append(missing, op)
			}
			where[op] = append(where[op], n.GetName())
		}
	}
	if len(missing) > 0 {
		var parts []string
		for _, op := range missing {
			ns := where[op]
			switch len(ns) {
			case 1:
				parts = append(parts, fmt.Sprintf("%s (node %q)", op, ns[0]))
			default:
				parts = append(parts, fmt.Sprintf("%s (nodes %q and %d more)", op, ns[0], len(ns)-1))
			}
		}
		return nil, modelErr("operator%s %s %s not supported; ppnode supports %s",
			plural(len(missing)), strings.Join(parts, ", "), map[bool]string{true: "are", false: "is"}[len(missing) > 1],
			strings.Join(Supported(), ", "))
	}
	md, err = im.inputs(g, o)
	if err != nil {
		return nil, err
	}
	var outNames []string
	for _, out := range g.GetOutput() {
		outNames = append(outNames, out.GetName())
	}
	nodes := fuse(g.GetNode(), outNames, im)
	im.readers = map[string]int{}
	im.shapeOf = map[*konst]*value{}
	for _, n := range nodes {
		for _, in := range n.GetInput() {
			im.readers[in]++
		}
	}
	for _, out := range g.GetOutput() {
		im.readers[out.GetName()]++
	}
	for i, n := range nodes {
		im.node, im.index = n, i
		if len(n.GetOutput()) == 0 || n.GetOutput()[0] == "" {
			return nil, modelErr("node %q (%s) has no output", n.GetName(), n.GetOpType())
		}
		if err := im.run(n); err != nil {
			return nil, modelErr("node %q (%s): %v", n.GetName(), n.GetOpType(), err)
		}
		if im.err != nil {
			return nil, im.err
		}
	}
	if err := im.output(g, md, o); err != nil {
		return nil, err
	}
	for _, p := range md.Graph.Params() {
		for _, a := range aliases[p.Name] {
			if _, ok := im.initID[a]; ok || slices.Contains(p.Aliases, a) {
				return nil, modelErr("metadata %s gives %q the name %q, which another tensor of the model has or it gives twice", TiedKey, p.Name, a)
			}
			p.Aliases = append(p.Aliases, a)
		}
	}
	return md, nil
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

// minInputs are the inputs an operator needs at least (1 when not listed).
var minInputs = map[string]int{
	"Constant": 0, "Add": 2, "Sub": 2, "Mul": 2, "Div": 2, "Pow": 2, "Equal": 2, "Less": 2, "Greater": 2,
	"And": 2, "Or": 2, "Xor": 2, "Min": 2, "Max": 2, "Mod": 2, "Where": 3, "Gather": 2, "Reshape": 2,
	"Expand": 2, "Tile": 2, "Range": 3, "MatMul": 2, "Gemm": 2, "Conv": 2, "ConvTranspose": 2, "BatchNormalization": 5,
	"LayerNormalization": 2, "LSTM": 4, "GRU": 4, "RNN": 4, "ppnode.Linear": 3,
}

// run adds node n: folded when every input is a constant, else as layers.
func (im *importer) run(n *onnxpb.NodeProto) error {
	need, ok := minInputs[n.GetOpType()]
	if !ok {
		need = 1
	}
	for i := range need {
		if !im.has(i) {
			return fmt.Errorf("input %d is missing", i)
		}
	}
	for _, in := range n.GetInput() {
		if im.perRow[in] != nil {
			return im.runRows(n)
		}
	}
	allConst := true
	for _, in := range n.GetInput() {
		if in == "" {
			continue
		}
		if _, ok := im.vals[in]; ok {
			allConst = false
		} else if _, ok := im.consts[in]; !ok {
			return fmt.Errorf("input %q is not computed before this node", in)
		}
	}
	if allConst {
		f, ok := folders[n.GetOpType()]
		if !ok {
			return fmt.Errorf("no input is computed from the data")
		}
		k, err := f(im, n)
		if err != nil {
			return err
		}
		if k != nil { // else the folder made a value
			im.consts[n.GetOutput()[0]] = k
		}
		return nil
	}
	return handlers[n.GetOpType()](im, n)
}

// initializer is a tensor the file holds.
type initializer struct {
	name string
	k    *konst
}

type importer struct {
	b       *nn.Builder
	vals    map[string]*value
	consts  map[string]*konst
	inits   []initializer
	initID  map[string]int
	buffers map[string]bool       // initializers the file says are buffers
	trained map[int]string        // initializer -> the layer that trains it
	frozen  map[int]bool          // initializers used as constants
	taken   map[string]bool       // layer names
	readers map[string]int        // how many nodes (and graph outputs) read each tensor
	shapeOf map[*konst]*value     // a Shape's output: the value whose whole shape it is
	perRow  map[string]*batchRows // torch.arange over the batch and what was made of it (pick.go)
	opset   int64
	inputs0 string                                    // the first graph input, which carries the buffers
	unfused map[*onnxpb.NodeProto][]*onnxpb.NodeProto // fused nodes' originals
	node    *onnxpb.NodeProto
	index   int
	err     error // a problem found after a layer was added
}

// inputs declares the graph's inputs, in the data's order.
func (im *importer) inputs(g *onnxpb.GraphProto, o Options) (*Model, error) {
	var ins []*onnxpb.ValueInfoProto
	for _, in := range g.GetInput() {
		if _, ok := im.initID[in.GetName()]; !ok {
			ins = append(ins, in)
		}
	}
	if len(ins) != len(o.Inputs) {
		return nil, modelErr("the model has %d data inputs (%s); the data has %d arrays (%s)",
			len(ins), infoNames(ins), len(o.Inputs), inputNames(o.Inputs))
	}
	if len(ins) == 0 {
		return nil, modelErr("the model has no data input")
	}
	// Match the data's arrays to the model's inputs: by name, or one to one.
	match := make([]*onnxpb.ValueInfoProto, len(o.Inputs))
	if len(ins) == 1 {
		match[0] = ins[0]
	} else {
		byName := map[string]*onnxpb.ValueInfoProto{}
		for _, in := range ins {
			byName[in.GetName()] = in
		}
		for i, d := range o.Inputs {
			if match[i] = byName[d.Name]; match[i] == nil {
				return nil, modelErr("the data's array %q is none of the model's inputs (%s): name the arrays as the inputs (torch.onnx.export's input_names)",
					d.Name, infoNames(ins))
			}
		}
	}
	md := &Model{}
	for i, in := range match {
		v, shape, ch, err := im.input(in, o.Inputs[i])
		if err != nil {
			return nil, err
		}
		im.vals[in.GetName()] = v
		md.Input = append(md.Input, shape)
		md.ChannelAxes = append(md.ChannelAxes, ch)
	}
	im.inputs0 = im.vals[match[0].GetName()].name
	return md, nil
}

func infoNames(ins []*onnxpb.ValueInfoProto) string {
	var s []string
	for _, in := range ins {
		s = append(s, in.GetName())
	}
	return strings.Join(s, ", ")
}

func inputNames(ins []Input) string {
	var s []string
	for _, in := range ins {
		s = append(s, in.Name)
	}
	return strings.Join(s, ", ")
}

// input declares one graph input fed by the data's array d.
func (im *importer) input(in *onnxpb.ValueInfoProto, d Input) (*value, []int, int, error) {
	tt := in.GetType().GetTensorType()
	if tt == nil {
		return nil, nil, 0, modelErr("input %q is not a tensor", in.GetName())
	}
	isInt := false
	switch onnxpb.TensorProto_DataType(tt.GetElemType()) {
	case onnxpb.TensorProto_FLOAT:
	case onnxpb.TensorProto_INT64, onnxpb.TensorProto_INT32:
		isInt = true
	default:
		return nil, nil, 0, modelErr("input %q is of type %s; ppnode feeds float32 or integer arrays", in.GetName(),
			onnxpb.TensorProto_DataType(tt.GetElemType()))
	}
	if isInt != d.Int {
		what := map[bool]string{true: "integers", false: "floats"}
		return nil, nil, 0, modelErr("input %q takes %s; the data's array %q holds %s", in.GetName(), what[isInt], d.Name, what[d.Int])
	}
	dims := tt.GetShape().GetDim()
	if len(dims) < 2 {
		return nil, nil, 0, modelErr("input %q has %d dimensions; want [batch, ...]", in.GetName(), len(dims))
	}
	shape := make([]int, len(dims)-1)
	for i, dd := range dims[1:] {
		v := dd.GetDimValue()
		if v < 1 || v > math.MaxInt32 {
			return nil, nil, 0, modelErr("input %q: dimension %d is %q, want a fixed size (export with dynamic_axes on the batch only)", in.GetName(), i+1, dd.String())
		}
		shape[i] = int(v)
	}
	name := im.layerName(in.GetName(), "")
	data := d.Shape
	ch := len(data) - 1
	var v *value
	switch {
	case slices.Equal(data, shape):
		x := im.b.Input(name, data...)
		v = &value{name: x, stored: slices.Clone(data), dims: axesOf(len(shape))}
		if len(shape) == 3 {
			ch = 0
		}
	case len(shape) == 3 && slices.Equal(data, []int{shape[1], shape[2], shape[0]}):
		x := im.b.Input(name, data...)
		v = &value{name: x, stored: slices.Clone(data), dims: [][]int{{0}, {3}, {1}, {2}}}
	case len(shape) == 1 && nn.Size(data) == shape[0]:
		x := im.b.Input(name, data...)
		var all []int
		for a := 1; a <= len(data); a++ {
			all = append(all, a)
		}
		v = &value{name: x, stored: slices.Clone(data), dims: [][]int{{0}, all}}
	default:
		return nil, nil, 0, modelErr("input %q takes samples of shape %v; the data's %q are %v", in.GetName(), shape, d.Name, data)
	}
	v.isInt = isInt
	if isInt {
		ch = -1
	}
	return v, shape, ch, nil
}

// axesOf is the view of a stored tensor of rank r (per sample) in its own
// order.
func axesOf(r int) [][]int {
	dims := [][]int{{0}}
	for a := 1; a <= r; a++ {
		dims = append(dims, []int{a})
	}
	return dims
}

// output makes the graph's output the logits, [N, classes] or [N, T...,
// classes], and adds the buffers.
func (im *importer) output(g *onnxpb.GraphProto, md *Model, o Options) error {
	outs := g.GetOutput()
	if len(outs) != 1 {
		return modelErr("the model has %d outputs; ppnode trains one, the logits", len(outs))
	}
	v, ok := im.vals[outs[0].GetName()]
	if !ok {
		return modelErr("output %q is not computed from the input", outs[0].GetName())
	}
	if v.rank() < 2 {
		return modelErr("output %q has shape %v; want [batch, classes] or [batch, positions, classes]", outs[0].GetName(), v)
	}
	v, err := im.rowMajor(v)
	if err != nil {
		return modelErr("output %q: %v", outs[0].GetName(), err)
	}
	shape := v.sampleShape()
	if v.isInt {
		return modelErr("output %q holds integers; want logits", outs[0].GetName())
	}
	classes := shape[len(shape)-1]
	im.carry()
	graph, err := im.b.Build(v.name)
	if err != nil {
		return modelErr("output %q: %v", outs[0].GetName(), err)
	}
	if im.err != nil {
		return im.err
	}
	for id := range im.frozen {
		if l, ok := im.trained[id]; ok {
			return modelErr("initializer %q is trained by layer %s and also used as a constant; ppnode cannot do both", im.inits[id].name, l)
		}
	}
	if err := nn.CheckTies(graph.Params()); err != nil {
		return modelErr("%v", err)
	}
	md.Graph, md.Classes, md.Labels = graph, classes, shape[:len(shape)-1]
	return nil
}

// carry adds the initializers used only as constants as buffers of a
// first layer that passes the first input through, so that the weights
// file holds the model's whole state_dict.
func (im *importer) carry() {
	var ids []int
	for id := range im.frozen {
		if _, ok := im.trained[id]; !ok {
			ids = append(ids, id)
		}
	}
	if len(ids) == 0 {
		return
	}
	sort.Ints(ids)
	l := &nn.Carry{}
	var names []string
	for _, id := range ids {
		in := im.inits[id]
		f, ok := in.k.floats() // initializers hold no batch size
		if !ok {
			continue
		}
		l.Buffers = append(l.Buffers, &nn.Param{Value: nn.New(shapeOrScalar(in.k.shape)...), Given: slices.Clone(f)})
		names = append(names, in.name)
	}
	im.node = nil
	im.b.AddFirst(im.layerName("buffers", ""), l, im.inputs0)
	for j, p := range l.Buffers { // the builder prefixed them
		p.Name = names[j]
	}
}

func shapeOrScalar(s []int) []int {
	if len(s) == 0 {
		return []int{1}
	}
	return s
}

// layerName makes a graph name from an ONNX one, unique among the layers.
// PyTorch's scoped names become module paths: "/layer1/layer1.0/conv2/Conv"
// is "layer1.0.conv2" (the name of its parameters' module) and
// "/layer1/layer1.0/Relu_1" is "layer1.0.Relu_1".
func (im *importer) layerName(base, suffix string) string {
	if rest, ok := strings.CutPrefix(base, "/"); ok && im.node != nil {
		segs := strings.Split(rest, "/")
		path := ""
		for _, seg := range segs[:len(segs)-1] {
			last := path[strings.LastIndex(path, ".")+1:]
			switch {
			case path == "":
				path = seg
			case strings.HasPrefix(seg, last+"."): // "layer1" then "layer1.0"
				path = path[:len(path)-len(last)] + seg
			default:
				path += "." + seg
			}
		}
		op := segs[len(segs)-1]
		switch {
		case path == "":
			base = op
		case op == im.node.GetOpType() || strings.HasPrefix(im.node.GetOpType(), "ppnode."):
			base = path // a fused node is its module
		default:
			base = path + "." + op
		}
	}
	if base == "" {
		op := "layer"
		if im.node != nil {
			op = im.node.GetOpType()
		}
		base = fmt.Sprintf("%s_%d", op, im.index)
	}
	if suffix != "" {
		base += "." + suffix
	}
	base = strings.Map(func(r rune) rune {
		if strings.ContainsRune(" ,;@-", r) || r < ' ' { // partition descriptions use these
			return '_'
		}
		return r
	}, base)
	name := base
	for k := 2; im.taken[name]; k++ {
		name = base + "_" + strconv.Itoa(k)
	}
	im.taken[name] = true
	return name
}

// add appends a layer reading ins and returns its name.
func (im *importer) add(suffix string, l nn.Layer, ins ...*value) string {
	names := make([]string, len(ins))
	for i, v := range ins {
		names[i] = v.name
	}
	base := ""
	if im.node != nil {
		base = im.node.GetName()
	}
	return im.b.Add(im.layerName(base, suffix), l, names...)
}

// set records the node's output i.
func (im *importer) set(i int, v *value) {
	if i < len(im.node.GetOutput()) {
		im.vals[im.node.GetOutput()[i]] = v
	}
}

// setK records the node's output i as a constant.
func (im *importer) setK(i int, k *konst) {
	if i < len(im.node.GetOutput()) {
		im.consts[im.node.GetOutput()[i]] = k
	}
}

// val returns input i of the node as a value, or an error saying what it is.
func (im *importer) val(i int) (*value, error) {
	ins := im.node.GetInput()
	if i >= len(ins) || ins[i] == "" {
		return nil, fmt.Errorf("input %d is missing", i)
	}
	if v, ok := im.vals[ins[i]]; ok {
		return v, nil
	}
	if _, ok := im.consts[ins[i]]; ok {
		return nil, fmt.Errorf("input %q is a constant where ppnode needs values computed from the data", ins[i])
	}
	return nil, fmt.Errorf("input %q is not computed before this node", ins[i])
}

// konst returns input i of the node when it is a constant.
func (im *importer) konst(i int) (*konst, bool) {
	ins := im.node.GetInput()
	if i >= len(ins) || ins[i] == "" {
		return nil, false
	}
	k, ok := im.consts[ins[i]]
	return k, ok
}

// has reports whether input i is given.
func (im *importer) has(i int) bool {
	ins := im.node.GetInput()
	return i < len(ins) && ins[i] != ""
}

// freeze records that the initializers k comes from are used as
// constants: they are not trained.
func (im *importer) freeze(ks ...*konst) {
	for _, k := range ks {
		if k == nil {
			continue
		}
		for _, s := range k.src {
			if s >= 0 {
				im.frozen[int(s>>32)] = true
			}
		}
	}
}

// noUse checks that the node's outputs from i on are read by nothing.
func (im *importer) noUse(from int) error {
	for _, out := range im.node.GetOutput()[min(from, len(im.node.GetOutput())):] {
		if out != "" && im.readers[out] > 0 {
			return fmt.Errorf("output %q is used; ppnode computes only the first output", out)
		}
	}
	return nil
}

func attrInt(n *onnxpb.NodeProto, name string, def int64) int64 {
	for _, a := range n.GetAttribute() {
		if a.GetName() == name {
			return a.GetI()
		}
	}
	return def
}

func attrFloat(n *onnxpb.NodeProto, name string, def float32) float32 {
	for _, a := range n.GetAttribute() {
		if a.GetName() == name {
			return a.GetF()
		}
	}
	return def
}

func attrInts(n *onnxpb.NodeProto, name string) ([]int64, bool) {
	for _, a := range n.GetAttribute() {
		if a.GetName() == name {
			return a.GetInts(), true
		}
	}
	return nil, false
}

func attrString(n *onnxpb.NodeProto, name, def string) string {
	for _, a := range n.GetAttribute() {
		if a.GetName() == name {
			return string(a.GetS())
		}
	}
	return def
}

// attrStrings is a list-of-strings attribute, if set.
func attrStrings(n *onnxpb.NodeProto, name string) ([]string, bool) {
	for _, a := range n.GetAttribute() {
		if a.GetName() == name {
			var out []string
			for _, b := range a.GetStrings() {
				out = append(out, string(b))
			}
			return out, true
		}
	}
	return nil, false
}

// small converts attribute values to ints, refusing absurd ones.
func small(vs []int64, lo int64) ([]int, error) {
	out := make([]int, len(vs))
	for i, v := range vs {
		if v < lo || v > 1<<20 {
			return nil, fmt.Errorf("value %d in %v", v, vs)
		}
		out[i] = int(v)
	}
	return out, nil
}
