package nn

import (
	"fmt"
)

// Stage runs a connected or unconnected subset of a graph's layers: the
// tensors that cross into the subset are its Inputs, the ones that leave it
// (or are the graph's output) its Outputs. A whole model is the stage of all
// its layers. A Stage is not safe for concurrent use.
type Stage struct {
	g     *Graph
	nodes []*Node
	// Inputs names the tensors read from outside the stage, in order of first
	// use; Outputs names the stage's nodes read from outside it or the graph
	// output, in node order.
	Inputs  []string
	Outputs []string

	args     [][]ref  // per local node: where each of its inputs comes from
	need     [][]bool // per local node: which of its inputs need a gradient
	inNeed   []bool   // per stage input: whether its gradient is returned
	outIndex []int    // per output: local node index
	allGrads bool     // gradients of every input and node are computed
	// fused, per local node: for a ReLU that the BatchNorm before it applies
	// (its only input, which nothing else reads), that node's index; else -1.
	fused []int
	// team: the stage has a convolution or pooling layer, and its passes run
	// on the team thread on the fast path (team.go).
	team  bool
	slots []*stageSlot
	// shared, per local node: its layer shares a parameter with another
	// layer of the graph; frozen: it has parameters and none trains.
	shared, frozen []bool
}

// ref names a tensor inside a stage: a local node's output or a stage input.
type ref struct {
	input bool
	i     int
}

type stageSlot struct {
	ins   []*Tensor   // stage inputs of this micro-batch
	vals  []*Tensor   // per local node: its output
	argv  [][]*Tensor // per local node: its input tensors
	layer []Slot      // per local node: the layer's buffers

	// Gradient accumulators for node outputs and stage inputs. A first
	// contribution is borrowed; a second is added into an owned buffer.
	grad, inGrad   []*Tensor
	owned, inOwned []bool
	acc, inAcc     []Slot
	outs           []*Tensor
	// split, per local node: BackwardInput left its parameter gradients
	// to BackwardWeight.
	split []bool
}

// Stage returns the executor for the named layers, or an error naming an
// unknown or repeated layer.
func (g *Graph) Stage(names []string) (*Stage, error) {
	want := map[string]bool{}
	for _, n := range names {
		if g.Node(n) == nil {
			return nil, fmt.Errorf("nn: stage names unknown layer %q", n)
		}
		if want[n] {
			return nil, fmt.Errorf("nn: stage names layer %q twice", n)
		}
		want[n] = true
	}
	s := &Stage{g: g}
	local := map[string]int{}
	inputs := map[string]int{}
	for _, n := range g.Nodes {
		if want[n.Name] {
			local[n.Name] = len(s.nodes)
			s.nodes = append(s.nodes, n)
		}
	}
	for _, n := range s.nodes {
		refs := make([]ref, len(n.Inputs))
		need := make([]bool, len(n.Inputs))
		for i, in := range n.Inputs {
			if j, ok := local[in]; ok {
				refs[i] = ref{i: j}
				need[i] = s.nodes[j].RequiresGrad
				continue
			}
			j, ok := inputs[in]
			if !ok {
				j = len(s.Inputs)
				inputs[in] = j
				s.Inputs = append(s.Inputs, in)
				s.inNeed = append(s.inNeed, !g.IsInput(in) && g.Node(in).RequiresGrad)
			}
			refs[i] = ref{input: true, i: j}
			need[i] = s.inNeed[j]
		}
		s.args = append(s.args, refs)
		s.need = append(s.need, need)
	}
	consumed := map[string]bool{}
	for _, n := range g.Nodes {
		if !want[n.Name] {
			for _, in := range n.Inputs {
				consumed[in] = true
			}
		}
	}
	for i, n := range s.nodes {
		if consumed[n.Name] || n.Name == g.Output {
			s.Outputs = append(s.Outputs, n.Name)
			s.outIndex = append(s.outIndex, i)
		}
	}
	s.fuse(consumed)
	owners := map[*Param]int{}
	for _, n := range g.Nodes {
		for _, p := range n.Layer.Params() {
			owners[p]++
		}
	}
	s.shared, s.frozen = make([]bool, len(s.nodes)), make([]bool, len(s.nodes))
	for k, n := range s.nodes {
		for _, p := range n.Layer.Params() {
			s.shared[k] = s.shared[k] || owners[p] > 1
		}
		s.frozen[k] = Frozen(n.Layer)
	}
	for _, n := range s.nodes {
		switch n.Layer.(type) {
		case *Conv2D, *MaxPool2D, *AvgPool2D:
			s.team = dnnlTeam
		}
	}
	return s, nil
}

// fuse finds the ReLUs that the BatchNorm before them can apply: the
// ReLU's only input is a BatchNorm of the stage whose output nothing else
// reads (no other layer, outside the stage included, nor the graph output).
func (s *Stage) fuse(consumed map[string]bool) {
	readers := map[string]int{}
	for _, n := range s.g.Nodes {
		for _, in := range n.Inputs {
			readers[in]++
		}
	}
	s.fused = make([]int, len(s.nodes))
	for k, n := range s.nodes {
		s.fused[k] = -1
		if !isReLU(n.Layer) || len(s.args[k]) != 1 || s.args[k][0].input {
			continue
		}
		j := s.args[k][0].i
		b := s.nodes[j]
		if _, ok := b.Layer.(*BatchNorm); ok && readers[b.Name] == 1 && !consumed[b.Name] && b.Name != s.g.Output {
			s.fused[k] = j
		}
	}
}

func isReLU(l Layer) bool {
	switch l.(type) {
	case ReLU, *ReLU:
		return true
	}
	return false
}

// Whole returns the stage of every layer.
func (g *Graph) Whole() *Stage {
	names := make([]string, len(g.Nodes))
	for i, n := range g.Nodes {
		names[i] = n.Name
	}
	s, err := g.Stage(names)
	if err != nil {
		panic(err) // unreachable: the names come from the graph
	}
	return s
}

// WantInputGrads makes Backward compute the gradient of every input,
// graph inputs included (for gradient checks and saliency).
func (s *Stage) WantInputGrads() {
	s.allGrads = true
	for k := range s.fused { // every node's own gradient is wanted
		s.fused[k] = -1
	}
	for _, ss := range s.slots {
		if ss == nil {
			continue
		}
		for j := range ss.layer {
			ss.layer[j].reluAfter = false
		}
	}
	for i := range s.inNeed {
		s.inNeed[i] = true
	}
	for _, need := range s.need {
		for i := range need {
			need[i] = true
		}
	}
}

// Nodes returns the stage's nodes in topological order.
func (s *Stage) Nodes() []*Node { return s.nodes }

// Params returns the stage's parameters and buffers in node order.
func (s *Stage) Params() []*Param {
	var ps []*Param
	for _, n := range s.nodes {
		ps = append(ps, n.Layer.Params()...)
	}
	return ps
}

func (s *Stage) slot(i int) *stageSlot {
	if i < len(s.slots) && s.slots[i] == nil {
		s.slots[i] = s.newSlot()
	}
	for len(s.slots) <= i {
		s.slots = append(s.slots, s.newSlot())
	}
	return s.slots[i]
}

// ReleaseSlot drops slot i's activations and buffers (a later Forward
// into it allocates them again).
func (s *Stage) ReleaseSlot(i int) {
	if i < len(s.slots) {
		s.slots[i] = nil
	}
}

func (s *Stage) newSlot() *stageSlot {
	n, m := len(s.nodes), len(s.Inputs)
	ss := &stageSlot{
		ins: make([]*Tensor, m), vals: make([]*Tensor, n), argv: make([][]*Tensor, n),
		layer: make([]Slot, n), grad: make([]*Tensor, n), inGrad: make([]*Tensor, m),
		owned: make([]bool, n), inOwned: make([]bool, m), acc: make([]Slot, n), inAcc: make([]Slot, m),
		outs: make([]*Tensor, len(s.Outputs)), split: make([]bool, n),
	}
	for k, refs := range s.args {
		ss.argv[k] = make([]*Tensor, len(refs))
	}
	for _, j := range s.fused {
		if j >= 0 {
			ss.layer[j].reluAfter = true
		}
	}
	return ss
}

// Forward runs micro-batch slot through the stage. in holds one tensor per
// Inputs entry; they must stay unchanged until Backward of the same slot
// returns. The returned slice (one tensor per Outputs entry) and its
// tensors belong to the stage and stay valid until the slot's next Forward.
func (s *Stage) Forward(c *Ctx, slot int, in []*Tensor) []*Tensor {
	if len(in) != len(s.Inputs) {
		panic(fmt.Sprintf("nn: stage takes %d inputs, got %d", len(s.Inputs), len(in)))
	}
	if s.team && fastPath(c) && !c.team {
		return onTeam(s, c, slot, in, (*Stage).forward)
	}
	return s.forward(c, slot, in)
}

func (s *Stage) forward(c *Ctx, slot int, in []*Tensor) []*Tensor {
	ss := s.slot(slot)
	copy(ss.ins, in)
	for k, n := range s.nodes {
		argv := ss.argv[k]
		for i, r := range s.args[k] {
			if r.input {
				argv[i] = ss.ins[r.i]
			} else {
				argv[i] = ss.vals[r.i]
			}
		}
		if j := s.fused[k]; j >= 0 {
			ss.vals[k] = ss.vals[j] // the BatchNorm applied the ReLU
			continue
		}
		ss.vals[k] = n.Layer.Forward(c, &ss.layer[k], argv)
	}
	for j, k := range s.outIndex {
		ss.outs[j] = ss.vals[k]
	}
	return ss.outs
}

// Backward runs the backward pass of slot, whose Forward ran last for it.
// dout holds the gradient of each Outputs entry (nil where an output gets no
// gradient). Parameter gradients are added to the Params' Grad. The result
// holds the gradient of each Inputs entry that has one (nil for graph
// inputs); it belongs to the stage.
func (s *Stage) Backward(c *Ctx, slot int, dout []*Tensor) []*Tensor {
	if len(dout) != len(s.Outputs) {
		panic(fmt.Sprintf("nn: stage has %d outputs, got %d gradients", len(s.Outputs), len(dout)))
	}
	if s.team && fastPath(c) && !c.team {
		return onTeam(s, c, slot, dout, (*Stage).backward)
	}
	return s.backward(c, slot, dout)
}

// BackwardInput runs the first half of slot's backward pass, as Backward
// does but for the parameter gradients of the layers that split their
// backward pass (SplitLayer), which BackwardWeight of the slot adds
// later: the input gradients are ready sooner. Between the two, the slot
// takes no other pass. Together they compute what Backward computes, bit
// for bit; parameter gradients accumulate in the order of the calls, so
// BackwardWeight passes run in the order of their micro-batches.
func (s *Stage) BackwardInput(c *Ctx, slot int, dout []*Tensor) []*Tensor {
	if len(dout) != len(s.Outputs) {
		panic(fmt.Sprintf("nn: stage has %d outputs, got %d gradients", len(s.Outputs), len(dout)))
	}
	if s.team && fastPath(c) && !c.team {
		return onTeam(s, c, slot, dout, (*Stage).backwardInput)
	}
	return s.backwardInput(c, slot, dout)
}

// BackwardWeight runs the second half of slot's backward pass (see
// BackwardInput).
func (s *Stage) BackwardWeight(c *Ctx, slot int) {
	if s.team && fastPath(c) && !c.team {
		onTeam(s, c, slot, nil, (*Stage).backwardWeight)
		return
	}
	s.backwardWeight(c, slot, nil)
}

// Splits reports whether any layer of the stage splits its backward pass
// in context c: whether BackwardWeight has anything to do.
func (s *Stage) Splits(c *Ctx) bool {
	for k := range s.nodes {
		if s.splits(c, k) {
			return true
		}
	}
	return false
}

// splits reports whether node k's layer splits its backward pass: it can,
// it has a parameter to train, and no other layer of the graph shares its
// parameters (whose gradients would then be added in another order).
func (s *Stage) splits(c *Ctx, k int) bool {
	l, ok := s.nodes[k].Layer.(SplitLayer)
	return ok && !s.shared[k] && !s.frozen[k] && l.Splits(c)
}

func (s *Stage) backward(c *Ctx, slot int, dout []*Tensor) []*Tensor {
	return s.backwardPass(c, slot, dout, false)
}

func (s *Stage) backwardInput(c *Ctx, slot int, dout []*Tensor) []*Tensor {
	return s.backwardPass(c, slot, dout, true)
}

func (s *Stage) backwardWeight(c *Ctx, slot int, _ []*Tensor) []*Tensor {
	ss := s.slot(slot)
	for k := len(s.nodes) - 1; k >= 0; k-- {
		if !ss.split[k] {
			continue
		}
		ss.split[k] = false
		s.nodes[k].Layer.(SplitLayer).BackwardWeight(c, &ss.layer[k], ss.argv[k], ss.vals[k], ss.grad[k])
	}
	return nil
}

// backwardPass runs slot's backward pass; with split, the layers that
// split leave their parameter gradients to backwardWeight.
func (s *Stage) backwardPass(c *Ctx, slot int, dout []*Tensor, split bool) []*Tensor {
	ss := s.slot(slot)
	clear(ss.split)
	clear(ss.grad)
	clear(ss.inGrad)
	for j, k := range s.outIndex {
		if dout[j] != nil {
			addGrad(c, &ss.grad[k], &ss.owned[k], &ss.acc[k], dout[j])
		}
	}
	for k := len(s.nodes) - 1; k >= 0; k-- {
		g := ss.grad[k]
		n := s.nodes[k]
		if g == nil || !(n.RequiresGrad || s.allGrads) {
			continue
		}
		if j := s.fused[k]; j >= 0 {
			// The BatchNorm takes the ReLU's output gradient as it is.
			if s.need[k][0] {
				addGrad(c, &ss.grad[j], &ss.owned[j], &ss.acc[j], g)
			}
			continue
		}
		var din []*Tensor
		switch sl, ok := n.Layer.(SplitLayer); {
		case ok && sl.Splits(c) && s.frozen[k]:
			// Nothing reads a frozen parameter's gradient: the input
			// gradients only.
			din = sl.BackwardInput(c, &ss.layer[k], ss.argv[k], ss.vals[k], g, s.need[k])
		case split && s.splits(c, k):
			din = sl.BackwardInput(c, &ss.layer[k], ss.argv[k], ss.vals[k], g, s.need[k])
			ss.split[k] = true
		default:
			din = n.Layer.Backward(c, &ss.layer[k], ss.argv[k], ss.vals[k], g, s.need[k])
		}
		for i, r := range s.args[k] {
			if !s.need[k][i] || din[i] == nil {
				continue
			}
			if r.input {
				addGrad(c, &ss.inGrad[r.i], &ss.inOwned[r.i], &ss.inAcc[r.i], din[i])
			} else {
				addGrad(c, &ss.grad[r.i], &ss.owned[r.i], &ss.acc[r.i], din[i])
			}
		}
	}
	return ss.inGrad
}

// addGrad adds t into the accumulator *acc. Contributions arrive in reverse
// node order of their consumers, a fixed order, so the sum is deterministic.
// The first addition writes acc + t into buf, which then holds the sum.
func addGrad(c *Ctx, acc **Tensor, owned *bool, buf *Slot, t *Tensor) {
	if *acc == nil {
		*acc, *owned = t, false
		return
	}
	a, x, y := F32(*acc), F32(t), F32(*acc)
	if !*owned {
		b := buf.Buf(0, t.Shape()...)
		y = F32(b)
		*acc, *owned = b, true
	}
	elementwise(c, ewAdd, a, x, y)
}
