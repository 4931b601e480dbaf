package onnx

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/ppnode/ppnode/nn"
	"github.com/ppnode/ppnode/onnx/onnxpb"
)

// Options describe the data a model will train on.
type Options struct {
	// Input is the data's per-sample shape. Besides the model's own input
	// shape, [H, W, C] images (ppnode's built-in sets) feed a [C, H, W]
	// model, and any shape of the same size feeds a model of flat features.
	Input []int
	// Classes is the data's number of classes; the model's outputs must be
	// at least as many.
	Classes int
}

// Model is an imported model.
type Model struct {
	Graph *nn.Graph
	// Input is the model's per-sample input shape as the file declares it.
	Input []int
	// ChannelAxis is the axis of a data sample that holds channels, the
	// axis standardisation works per.
	ChannelAxis int
	// Classes is the model's number of outputs.
	Classes int
}

// Supported lists the operators a model may use.
func Supported() []string {
	ops := make([]string, 0, len(handlers))
	for op := range handlers {
		ops = append(ops, op)
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

// Import turns a parsed model into a graph whose parameters start at the
// model's initializers.
func Import(m *onnxpb.ModelProto, o Options) (*Model, error) {
	im := &importer{
		b: nn.NewBuilder(), vals: map[string]*value{}, consts: map[string]*constant{},
		inits: map[string]*constant{}, used: map[string]bool{}, taken: map[string]bool{},
		opset: 13,
	}
	for _, op := range m.GetOpsetImport() {
		if d := op.GetDomain(); d == "" || d == "ai.onnx" {
			im.opset = op.GetVersion()
		}
	}
	g := m.GetGraph()
	for _, t := range g.GetInitializer() {
		c, err := tensorOf(t)
		if err != nil {
			return nil, err
		}
		im.inits[t.GetName()] = c
	}
	md, err := im.input(g, o)
	if err != nil {
		return nil, err
	}
	// Refuse an unsupported operator before building anything.
	for i, n := range g.GetNode() {
		if _, ok := handlers[n.GetOpType()]; !ok || n.GetDomain() != "" && n.GetDomain() != "ai.onnx" {
			return nil, modelErr("operator %s (node %q, #%d) is not supported; ppnode supports %s",
				n.GetOpType(), n.GetName(), i, strings.Join(Supported(), ", "))
		}
	}
	im.consumed = map[string]bool{}
	for _, n := range g.GetNode() {
		for _, in := range n.GetInput() {
			im.consumed[in] = true
		}
	}
	for _, out := range g.GetOutput() {
		im.consumed[out.GetName()] = true
	}
	for i, n := range g.GetNode() {
		im.node = n
		im.index = i
		if len(n.GetOutput()) == 0 || n.GetOutput()[0] == "" {
			return nil, modelErr("node %q (%s) has no output", n.GetName(), n.GetOpType())
		}
		if err := handlers[n.GetOpType()](im, n); err != nil {
			return nil, fmt.Errorf("node %q (%s): %w", n.GetName(), n.GetOpType(), err)
		}
	}
	outs := g.GetOutput()
	if len(outs) != 1 {
		return nil, modelErr("the model has %d outputs; ppnode trains one, the logits", len(outs))
	}
	v, ok := im.vals[outs[0].GetName()]
	if !ok {
		return nil, modelErr("output %q is not computed from the input", outs[0].GetName())
	}
	v = im.logical(v)
	if len(v.shape) != 1 {
		return nil, modelErr("output %q has per-sample shape %v; want [classes]", outs[0].GetName(), v.shape)
	}
	if v.shape[0] < o.Classes {
		return nil, modelErr("the model has %d outputs; the data has %d classes", v.shape[0], o.Classes)
	}
	graph, err := im.b.Build(v.name)
	if err != nil {
		return nil, modelErr("output %q: %v", outs[0].GetName(), err)
	}
	if im.err != nil {
		return nil, im.err
	}
	md.Graph, md.Classes = graph, v.shape[0]
	return md, nil
}

// value is an activation: a tensor of the graph being built.
type value struct {
	name  string // the graph's tensor (a layer or the input)
	shape []int  // the ONNX per-sample shape
	cl    bool   // a [C, H, W] value stored channels-last, [H, W, C]
}

// stored is the shape the graph's tensor has.
func (v *value) stored() []int {
	if v.cl {
		return []int{v.shape[1], v.shape[2], v.shape[0]}
	}
	return v.shape
}

// lastAxis reports whether per-sample axis a is the last axis as stored.
func (v *value) lastAxis(a int) bool {
	if v.cl {
		return a == 0
	}
	return a == len(v.shape)-1
}

type importer struct {
	b        *nn.Builder
	vals     map[string]*value
	consts   map[string]*constant
	inits    map[string]*constant
	used     map[string]bool // initializers taken by a layer
	taken    map[string]bool // layer names
	consumed map[string]bool // values something reads
	opset    int64
	batch    int64 // the input's fixed batch dimension, 0 when symbolic
	node     *onnxpb.NodeProto
	index    int
	err      error // a problem found after a layer was added
}

// batchDim stands for the batch dimension in shapes computed by Shape.
const batchDim = math.MinInt64

func (im *importer) input(g *onnxpb.GraphProto, o Options) (*Model, error) {
	var ins []*onnxpb.ValueInfoProto
	for _, in := range g.GetInput() {
		if _, ok := im.inits[in.GetName()]; !ok {
			ins = append(ins, in)
		}
	}
	if len(ins) != 1 {
		return nil, modelErr("the model has %d data inputs; ppnode feeds one", len(ins))
	}
	in := ins[0]
	tt := in.GetType().GetTensorType()
	if tt == nil || onnxpb.TensorProto_DataType(tt.GetElemType()) != onnxpb.TensorProto_FLOAT {
		return nil, modelErr("input %q is not a float tensor", in.GetName())
	}
	dims := tt.GetShape().GetDim()
	if len(dims) < 2 {
		return nil, modelErr("input %q has %d dimensions; want [batch, ...]", in.GetName(), len(dims))
	}
	im.batch = dims[0].GetDimValue()
	shape := make([]int, len(dims)-1)
	for i, d := range dims[1:] {
		if v := d.GetDimValue(); v < 1 || v > math.MaxInt32 {
			return nil, modelErr("input %q: dimension %d is %q, want a fixed size (export with dynamic_axes on the batch only)", in.GetName(), i+1, d.String())
		} else {
			shape[i] = int(v)
		}
	}
	md := &Model{Input: shape, ChannelAxis: len(o.Input) - 1}
	name := im.layerName(in.GetName(), "")
	data := o.Input
	switch {
	case slices.Equal(data, shape):
		im.vals[in.GetName()] = &value{name: im.b.Input(name, shape...), shape: shape}
		if len(shape) == 3 {
			md.ChannelAxis = 0
		}
	case len(shape) == 3 && slices.Equal(data, []int{shape[1], shape[2], shape[0]}):
		im.vals[in.GetName()] = &value{name: im.b.Input(name, data...), shape: shape, cl: true}
	case len(shape) == 1 && nn.Size(data) == shape[0]:
		x := im.b.Input(name, data...)
		im.vals[in.GetName()] = &value{name: im.b.Add(im.layerName(name, "flat"), nn.Flatten{}, x), shape: shape}
	default:
		return nil, modelErr("the model takes samples of shape %v; the data's are %v", shape, data)
	}
	return md, nil
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
		case op == im.node.GetOpType():
			base = path
		default:
			base = path + "." + op
		}
	}
	if base == "" {
		base = fmt.Sprintf("%s_%d", im.node.GetOpType(), im.index)
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
	return im.b.Add(im.layerName(im.node.GetName(), suffix), l, names...)
}

// set records the node's output i.
func (im *importer) set(i int, v *value) {
	if i < len(im.node.GetOutput()) {
		im.vals[im.node.GetOutput()[i]] = v
	}
}

// act returns input i of the node as an activation.
func (im *importer) act(i int) (*value, error) {
	ins := im.node.GetInput()
	if i >= len(ins) || ins[i] == "" {
		return nil, fmt.Errorf("input %d is missing", i)
	}
	v, ok := im.vals[ins[i]]
	if !ok {
		if _, k := im.konst(i); k {
			return nil, fmt.Errorf("input %q is a constant where ppnode needs values computed from the data", ins[i])
		}
		return nil, fmt.Errorf("input %q is not computed before this node", ins[i])
	}
	return v, nil
}

// konst returns input i of the node when it is a constant or initializer.
func (im *importer) konst(i int) (*constant, bool) {
	ins := im.node.GetInput()
	if i >= len(ins) || ins[i] == "" {
		return nil, false
	}
	if c, ok := im.consts[ins[i]]; ok {
		return c, true
	}
	c, ok := im.inits[ins[i]]
	return c, ok
}

// param returns input i as an initializer that becomes a parameter.
func (im *importer) param(i int, ranks ...int) (*constant, string, error) {
	ins := im.node.GetInput()
	if i >= len(ins) || ins[i] == "" {
		return nil, "", fmt.Errorf("input %d is missing", i)
	}
	c, ok := im.inits[ins[i]]
	if !ok {
		return nil, "", fmt.Errorf("input %q must be an initializer (a parameter of the module)", ins[i])
	}
	if c.f == nil {
		return nil, "", fmt.Errorf("parameter %q is not float", ins[i])
	}
	if len(ranks) > 0 && !slices.Contains(ranks, len(c.shape)) {
		return nil, "", fmt.Errorf("parameter %q has shape %v", ins[i], c.shape)
	}
	if im.used[ins[i]] {
		return nil, "", fmt.Errorf("parameter %q is used by two layers; shared weights are not supported", ins[i])
	}
	im.used[ins[i]] = true
	return c, ins[i], nil
}

// give names p after the initializer and starts it at its value (given in
// the exported layout with shape).
func (im *importer) give(p *nn.Param, name string, c *constant, shape ...int) {
	if len(shape) == 0 {
		shape = c.shape
	}
	p.Name = name
	v, err := p.FromExported(c.f, shape)
	if err != nil && im.err == nil {
		im.err = modelErr("parameter %v", err)
	}
	p.Given = v
}

// noUse checks that the node's outputs from i on are read by nothing.
func (im *importer) noUse(from int) error {
	for _, out := range im.node.GetOutput()[min(from, len(im.node.GetOutput())):] {
		if out != "" && im.consumed[out] {
			return fmt.Errorf("output %q is used; ppnode computes only the first output", out)
		}
	}
	return nil
}

// cl returns v stored channels-last, adding a Permute if it is not.
func (im *importer) channelsLast(v *value) (*value, error) {
	if v.cl {
		return v, nil
	}
	if len(v.shape) != 3 {
		return nil, fmt.Errorf("input of per-sample shape %v; want [C, H, W]", v.shape)
	}
	name := im.add("nhwc", &nn.Permute{Perm: []int{1, 2, 0}}, v)
	return &value{name: name, shape: v.shape, cl: true}, nil
}

// logical returns v stored in its ONNX layout.
func (im *importer) logical(v *value) *value {
	if !v.cl {
		return v
	}
	var l nn.Layer = &nn.Permute{Perm: []int{2, 0, 1}}
	if v.shape[1] == 1 && v.shape[2] == 1 {
		l = &nn.Reshape{Shape: v.shape}
	}
	return &value{name: im.add("nchw", l, v), shape: v.shape}
}

// axis turns an ONNX axis (batch included, negative from the end) into a
// per-sample axis.
func axis(a int64, rank int) (int, error) {
	r := int64(rank + 1)
	if a < 0 {
		a += r
	}
	if a <= 0 || a >= r {
		return 0, fmt.Errorf("axis %d of a tensor of %d dimensions: only per-sample axes are supported", a, r)
	}
	return int(a - 1), nil
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
