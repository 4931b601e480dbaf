package nn

import (
	"fmt"
	"slices"
	"sort"
	"strings"
)

// Node is one named layer of a graph and the names of the tensors it reads.
type Node struct {
	Name   string
	Layer  Layer
	Inputs []string
	// Shape is the per-sample output shape.
	Shape []int
	// RequiresGrad is set when a trainable parameter lies at or before this
	// node, so that its output needs a gradient.
	RequiresGrad bool
}

// Graph is a model: a DAG of named layers in topological order, graph inputs
// (the data) and one output (the logits).
type Graph struct {
	InputNames  []string
	InputShapes [][]int
	Nodes       []*Node
	Output      string

	index map[string]int // node name -> index in Nodes; graph inputs -> -1-i
}

// Builder assembles a Graph. The first error sticks and is returned by
// Build, so a model builder can chain Adds without checking each one.
type Builder struct {
	g   *Graph
	err error
}

// NewBuilder starts an empty graph.
func NewBuilder() *Builder {
	return &Builder{g: &Graph{index: map[string]int{}}}
}

// Input declares a graph input with its per-sample shape and returns its name.
func (b *Builder) Input(name string, shape ...int) string {
	if b.err != nil {
		return name
	}
	if _, dup := b.g.index[name]; dup {
		b.err = fmt.Errorf("nn: duplicate name %q", name)
		return name
	}
	b.g.index[name] = -1 - len(b.g.InputNames)
	b.g.InputNames = append(b.g.InputNames, name)
	b.g.InputShapes = append(b.g.InputShapes, append([]int(nil), shape...))
	return name
}

// Add appends a layer named name that reads the named tensors, and returns
// its name.
func (b *Builder) Add(name string, l Layer, inputs ...string) string {
	if b.err != nil {
		return name
	}
	g := b.g
	if name == "" || strings.ContainsAny(name, " ,;@") {
		b.err = fmt.Errorf("nn: bad layer name %q", name)
		return name
	}
	if _, dup := g.index[name]; dup {
		b.err = fmt.Errorf("nn: duplicate name %q", name)
		return name
	}
	shapes := make([][]int, len(inputs))
	req := false
	for i, in := range inputs {
		j, ok := g.index[in]
		if !ok {
			b.err = fmt.Errorf("nn: layer %q reads unknown tensor %q", name, in)
			return name
		}
		if j < 0 {
			shapes[i] = g.InputShapes[-1-j]
		} else {
			shapes[i] = g.Nodes[j].Shape
			req = req || g.Nodes[j].RequiresGrad
		}
	}
	if n, ok := l.(interface{ setName(string) }); ok {
		n.setName(name)
	}
	out, err := l.Build(shapes)
	if err != nil {
		b.err = fmt.Errorf("nn: layer %q (%s): %w", name, l.Kind(), err)
		return name
	}
	for _, p := range l.Params() {
		p.Name = name + "." + p.Name
		req = req || p.Trainable()
	}
	g.index[name] = len(g.Nodes)
	g.Nodes = append(g.Nodes, &Node{Name: name, Layer: l, Inputs: inputs, Shape: out, RequiresGrad: req})
	return name
}

// AddFirst is Add for a layer that reads only graph inputs, placed before
// every other layer (an importer's carrier of buffers, known only at the
// end).
func (b *Builder) AddFirst(name string, l Layer, inputs ...string) string {
	if b.err != nil {
		return name
	}
	for _, in := range inputs {
		if !b.g.IsInput(in) {
			b.err = fmt.Errorf("nn: layer %q added first reads %q, which is not a graph input", name, in)
			return name
		}
	}
	n := len(b.g.Nodes)
	if b.Add(name, l, inputs...); b.err != nil {
		return name
	}
	node := b.g.Nodes[n]
	copy(b.g.Nodes[1:], b.g.Nodes[:n])
	b.g.Nodes[0] = node
	for i, x := range b.g.Nodes {
		b.g.index[x.Name] = i
	}
	return name
}

// Shape is the per-sample output shape of the named layer or input, or nil
// if there is none (or an earlier Add failed).
func (b *Builder) Shape(name string) []int {
	j, ok := b.g.index[name]
	switch {
	case b.err != nil || !ok:
		return nil
	case j < 0:
		return b.g.InputShapes[-1-j]
	}
	return b.g.Nodes[j].Shape
}

// Build finishes the graph with output as the logits.
func (b *Builder) Build(output string) (*Graph, error) {
	if b.err != nil {
		return nil, b.err
	}
	j, ok := b.g.index[output]
	if !ok || j < 0 {
		return nil, fmt.Errorf("nn: output %q is not a layer", output)
	}
	b.g.Output = output
	return b.g, nil
}

// Node returns the named node, or nil.
func (g *Graph) Node(name string) *Node {
	j, ok := g.index[name]
	if !ok || j < 0 {
		return nil
	}
	return g.Nodes[j]
}

// IsInput reports whether name is a graph input.
func (g *Graph) IsInput(name string) bool {
	j, ok := g.index[name]
	return ok && j < 0
}

// Params returns every parameter and buffer in node order.
func (g *Graph) Params() []*Param {
	var ps []*Param
	for _, n := range g.Nodes {
		ps = append(ps, n.Layer.Params()...)
	}
	return ps
}

// Freeze keeps out of training (Param.Frozen) every parameter whose name,
// or one of its aliases, starts with one of prefixes (state_dict names:
// "encoder." freezes the encoder), and then marks again which nodes need
// a gradient: the layers before the first trainable one run no backward
// pass. Each prefix must name a trainable parameter, and one must stay
// trainable.
func (g *Graph) Freeze(prefixes []string) error {
	matched := make([]bool, len(prefixes))
	for _, p := range g.Params() {
		if !p.Trainable() {
			continue
		}
		for i, pre := range prefixes {
			if strings.HasPrefix(p.Name, pre) || slices.ContainsFunc(p.Aliases, func(a string) bool { return strings.HasPrefix(a, pre) }) {
				p.Frozen, matched[i] = true, true
			}
		}
	}
	if i := slices.Index(matched, false); i >= 0 {
		return fmt.Errorf("nn: no trainable parameter's name starts with %q", prefixes[i])
	}
	if g.ParamCount() == 0 {
		return fmt.Errorf("nn: freezing %s leaves nothing to train", strings.Join(prefixes, ", "))
	}
	for _, n := range g.Nodes {
		n.RequiresGrad = false
		for _, in := range n.Inputs {
			n.RequiresGrad = n.RequiresGrad || !g.IsInput(in) && g.Node(in).RequiresGrad
		}
		for _, p := range n.Layer.Params() {
			n.RequiresGrad = n.RequiresGrad || p.Trainable()
		}
	}
	return nil
}

// SetPadding gives the embedding whose table is named name (a state_dict
// name, "tok.weight") the padding row idx, whose lookups give it no
// gradient (PyTorch's padding_idx).
func (g *Graph) SetPadding(name string, idx int) error {
	found := false
	for _, n := range g.Nodes {
		e, ok := n.Layer.(*Embedding)
		if !ok || e.W.Name != name && !slices.Contains(e.W.Aliases, name) {
			continue
		}
		if idx < 0 || idx >= e.Num {
			return fmt.Errorf("nn: padding row %d of %s, a table of %d rows", idx, name, e.Num)
		}
		e.Padded, e.PaddingIdx, found = true, idx, true
	}
	if !found {
		return fmt.Errorf("nn: no embedding's table is named %q", name)
	}
	return nil
}

// Init sets every parameter to its initial value for seed.
func (g *Graph) Init(seed uint64) {
	for _, p := range g.Params() {
		p.Reset(seed)
	}
}

// ParamCount is the number of trainable scalars (a tied tensor's once).
func (g *Graph) ParamCount() int {
	n := 0
	for _, p := range Unique(g.Params()) {
		if p.Trainable() {
			n += Size(p.Value.Shape())
		}
	}
	return n
}

// SortByName orders parameters by name, the order of checkpoints and hashes.
func SortByName(ps []*Param) []*Param {
	out := append([]*Param(nil), ps...)
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Consumers returns, for every node and graph input name, the names of the
// nodes that read it, in node order.
func (g *Graph) Consumers() map[string][]string {
	c := map[string][]string{}
	for _, n := range g.Nodes {
		for _, in := range n.Inputs {
			c[in] = append(c[in], n.Name)
		}
	}
	return c
}
