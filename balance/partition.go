package balance

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/ppnode/ppnode/nn"
)

// Partition assigns every layer of a model to exactly one stage and every
// stage to a node. Stages are numbered by their position.
//
// With Chunks = v > 1 (the interleaved schedule) the partition has P×v
// stages on P nodes: stage s runs on the node of stage s mod P, so node i
// holds the v non-adjacent stages i, i+P, i+2P, ... (its chunks), and
// stages 0..P-1 are on distinct nodes. Such stages have no replicas.
type Partition struct {
	Chunks int         `json:"chunks,omitempty"`
	Stages []PartStage `json:"stages"`
}

// chunkNodes returns the number of nodes an interleaved partition's
// stages run on (P = stages / chunks), else the number of stages.
func (p *Partition) chunkNodes() int {
	if p.Chunks > 1 {
		return len(p.Stages) / p.Chunks
	}
	return len(p.Stages)
}

// PartStage is one stage: the node that runs it and its layers, in the
// model's topological order. Replicas are further nodes that run the same
// layers, each on its own share of the micro-batches, summing their
// parameter gradients before the optimizer step (see Plan). Shares
// are the micro-batches of Node and of each replica, in that order; empty
// is the equal split, in which earlier nodes take the remainder.
type PartStage struct {
	Node     string   `json:"node"`
	Layers   []string `json:"layers"`
	Replicas []string `json:"replicas,omitempty"`
	Shares   []int    `json:"shares,omitempty"`
}

// Nodes returns the stage's node and then its replicas.
func (st *PartStage) Nodes() []string { return append([]string{st.Node}, st.Replicas...) }

// Replicated reports whether a stage of p has replicas.
func (p *Partition) Replicated() bool {
	for _, st := range p.Stages {
		if len(st.Replicas) > 0 {
			return true
		}
	}
	return false
}

// split returns the micro-batches of each of the stage's nodes out of M:
// its Shares, or the equal split. The error names stage s.
func (st *PartStage) split(s, M int) ([]int, error) {
	R := 1 + len(st.Replicas)
	if len(st.Shares) == 0 {
		if R > M {
			return nil, fmt.Errorf("%w: stage %d has %d nodes for %d micro-batches (each needs one at least)", ErrPlan, s, R, M)
		}
		return equalSplit(M, R), nil
	}
	sum := 0
	for _, n := range st.Shares {
		sum += n
	}
	if sum != M {
		return nil, fmt.Errorf("%w: stage %d shares %v micro-batches among its nodes; the plan has %d", ErrPlan, s, st.Shares, M)
	}
	return slices.Clone(st.Shares), nil
}

// equalSplit cuts M micro-batches into R shares that differ by one at
// most, the larger first.
func equalSplit(M, R int) []int {
	out := make([]int, R)
	for r := range out {
		out[r] = M / R
		if r < M%R {
			out[r]++
		}
	}
	return out
}

// stageGraph is a validated partition: every layer in one stage, the
// stages' executors' boundaries as nn.Stage computes them, and the DAG of
// stages.
type stageGraph struct {
	g      *nn.Graph
	part   *Partition
	stage  []int   // node index -> stage
	layers [][]int // stage -> node indices, topological order
	// Per stage, from nn.Stage: input and output tensor names.
	inputs, outputs [][]string
	// from[s][k] is the producer stage of inputs[s][k] (coordinator for a
	// graph input); to[s][k] the consumer stages of outputs[s][k] in
	// gradient accumulation order.
	from [][]int
	to   [][][]int
	// succ and pred are the stage DAG's edges (sorted, without repeats).
	succ, pred [][]int
	depth      []int // longest path to a sink, counted in stages (sinks 1)
	loss       int   // the stage holding the graph output
}

// Coordinator is the peer of a stage's data input: the job's coordinator,
// which supplies micro-batches and labels.
const Coordinator = -1

// Validate checks that p is a partition of g over the named nodes: every
// layer in exactly one stage, no empty stage, known and distinct nodes, an
// acyclic stage graph, and gradients that can be summed in single-process
// order. A node runs one stage, as its node or as a replica; a stage's
// shares, if given, number its nodes and are positive. The error names
// the layer, node or stage at fault.
func (p *Partition) Validate(g *nn.Graph, nodes []string) error {
	idx := map[string]int{}
	for i, n := range nodes {
		idx[n] = i
	}
	_, err := newStageGraph(g, p, idx)
	return err
}

func newStageGraph(g *nn.Graph, p *Partition, nodeIndex map[string]int) (*stageGraph, error) {
	S := len(p.Stages)
	if S == 0 {
		return nil, fmt.Errorf("%w: the partition has no stages", ErrEmptyStage)
	}
	sg := &stageGraph{g: g, part: p, stage: make([]int, len(g.Nodes)), layers: make([][]int, S)}
	pos := map[string]int{}
	for i, n := range g.Nodes {
		pos[n.Name] = i
		sg.stage[i] = -1
	}
	if p.Chunks < 0 || p.Chunks == 1 {
		return nil, fmt.Errorf("%w: %d chunks per node (interleaving needs 2 at least; 0 for none)", ErrPlan, p.Chunks)
	}
	P := p.chunkNodes()
	if p.Chunks > 1 && (S%p.Chunks != 0 || P < 2) {
		return nil, fmt.Errorf("%w: %d stages in %d chunks per node (an interleaved partition has P×v stages on P >= 2 nodes)", ErrPlan, S, p.Chunks)
	}
	usedBy := map[string]int{}
	for s, st := range p.Stages {
		if len(st.Layers) == 0 {
			return nil, fmt.Errorf("%w: stage %d (node %q) has no layers", ErrEmptyStage, s, st.Node)
		}
		if p.Chunks > 1 && len(st.Replicas) > 0 {
			return nil, fmt.Errorf("%w: stage %d has replicas; an interleaved partition has none", ErrPlan, s)
		}
		if s >= P && st.Node != p.Stages[s%P].Node {
			return nil, fmt.Errorf("%w: stage %d is on node %q; with %d chunks per node it is chunk %d of stage %d's node %q",
				ErrNodeReused, s, st.Node, p.Chunks, s/P, s%P, p.Stages[s%P].Node)
		}
		for _, n := range st.Nodes() {
			if s >= P {
				break // a later chunk of a node checked above
			}
			if _, ok := nodeIndex[n]; !ok {
				return nil, fmt.Errorf("%w: stage %d is placed on node %q (have %s)", ErrUnknownNode, s, n, strings.Join(sortedKeys(nodeIndex), ", "))
			}
			if prev, dup := usedBy[n]; dup {
				if prev == s {
					return nil, fmt.Errorf("%w: node %q is named twice in stage %d", ErrNodeReused, n, s)
				}
				return nil, fmt.Errorf("%w: node %q holds stages %d and %d", ErrNodeReused, n, prev, s)
			}
			usedBy[n] = s
		}
		if k := len(st.Shares); k > 0 && (k != 1+len(st.Replicas) || k == 1) {
			return nil, fmt.Errorf("%w: stage %d has %d shares for %d nodes (shares are given for replicas only, one per node)", ErrPlan, s, k, 1+len(st.Replicas))
		}
		for _, n := range st.Shares {
			if n < 1 {
				return nil, fmt.Errorf("%w: stage %d has shares %v (each node needs one micro-batch at least)", ErrPlan, s, st.Shares)
			}
		}
		for _, name := range st.Layers {
			i, ok := pos[name]
			if !ok {
				return nil, fmt.Errorf("%w: stage %d names %q, which is not a layer of the model", ErrUnknownLayer, s, name)
			}
			if prev := sg.stage[i]; prev >= 0 {
				if prev == s {
					return nil, fmt.Errorf("%w: layer %q is named twice in stage %d", ErrDuplicateLayer, name, s)
				}
				return nil, fmt.Errorf("%w: layer %q is in stages %d and %d", ErrDuplicateLayer, name, prev, s)
			}
			sg.stage[i] = s
		}
	}
	for i, n := range g.Nodes {
		if sg.stage[i] < 0 {
			return nil, fmt.Errorf("%w: layer %q is in no stage", ErrMissingLayer, n.Name)
		}
		sg.layers[sg.stage[i]] = append(sg.layers[sg.stage[i]], i)
	}
	// Stage boundaries, as the executor computes them.
	sg.inputs, sg.outputs = make([][]string, S), make([][]string, S)
	sg.from, sg.to = make([][]int, S), make([][][]int, S)
	for s := range p.Stages {
		names := make([]string, len(sg.layers[s]))
		for k, i := range sg.layers[s] {
			names[k] = g.Nodes[i].Name
		}
		st, err := g.Stage(names)
		if err != nil {
			return nil, err
		}
		sg.inputs[s], sg.outputs[s] = st.Inputs, st.Outputs
	}
	succ := make([]map[int]bool, S)
	witness := map[[2]int][2]string{} // edge -> (consumer layer, tensor)
	for s := range succ {
		succ[s] = map[int]bool{}
	}
	for s := range p.Stages {
		for _, t := range sg.inputs[s] {
			from := Coordinator
			if !g.IsInput(t) {
				from = sg.stage[pos[t]]
				succ[from][s] = true
			}
			sg.from[s] = append(sg.from[s], from)
		}
	}
	for _, n := range g.Nodes {
		for _, t := range n.Inputs {
			if g.IsInput(t) {
				continue
			}
			a, b := sg.stage[pos[t]], sg.stage[pos[n.Name]]
			if a != b {
				if _, ok := witness[[2]int{a, b}]; !ok {
					witness[[2]int{a, b}] = [2]string{n.Name, t}
				}
			}
		}
	}
	sg.succ, sg.pred = make([][]int, S), make([][]int, S)
	for s := range succ {
		for t := range succ[s] {
			sg.succ[s] = append(sg.succ[s], t)
			sg.pred[t] = append(sg.pred[t], s)
		}
	}
	for s := range sg.succ {
		slices.Sort(sg.succ[s])
		slices.Sort(sg.pred[s])
	}
	order, err := sg.topo(witness)
	if err != nil {
		return nil, err
	}
	sg.depth = make([]int, S)
	for k := len(order) - 1; k >= 0; k-- {
		s := order[k]
		d := 1
		for _, t := range sg.succ[s] {
			d = max(d, sg.depth[t]+1)
		}
		sg.depth[s] = d
	}
	sg.loss = sg.stage[pos[g.Output]]
	if err := sg.gradientOrder(pos); err != nil {
		return nil, err
	}
	return sg, nil
}

// topo returns the stages in a topological order, or an error naming a
// cycle with the layer that makes each of its edges.
func (sg *stageGraph) topo(witness map[[2]int][2]string) ([]int, error) {
	S := len(sg.succ)
	indeg := make([]int, S)
	for s := range sg.succ {
		for _, t := range sg.succ[s] {
			indeg[t]++
		}
	}
	var order, queue []int
	for s := 0; s < S; s++ {
		if indeg[s] == 0 {
			queue = append(queue, s)
		}
	}
	for len(queue) > 0 {
		s := queue[0]
		queue = queue[1:]
		order = append(order, s)
		for _, t := range sg.succ[s] {
			if indeg[t]--; indeg[t] == 0 {
				queue = append(queue, t)
			}
		}
	}
	if len(order) == S {
		return order, nil
	}
	// Walk predecessors inside the remaining subgraph until a stage repeats.
	s := -1
	for t := 0; t < S; t++ {
		if indeg[t] > 0 {
			s = t
			break
		}
	}
	seen := map[int]int{}
	var path []int
	for {
		if k, ok := seen[s]; ok {
			path = path[k:]
			break
		}
		seen[s] = len(path)
		path = append(path, s)
		for _, t := range sg.succ[s] {
			if indeg[t] > 0 {
				s = t
				break
			}
		}
	}
	var parts []string
	for k, a := range path {
		b := path[(k+1)%len(path)]
		w := witness[[2]int{a, b}]
		parts = append(parts, fmt.Sprintf("layer %q of stage %d reads %q of stage %d", w[0], b, w[1], a))
	}
	return nil, fmt.Errorf("%w: %s", ErrCycle, strings.Join(parts, "; "))
}

// gradientOrder fills sg.to and checks that each tensor's gradient can be
// summed as one process sums it: nn adds the contributions of a tensor's
// consumers in reverse node order, each into the running sum. A consumer
// stage returns the sum of its own consumers' contributions, the runtime
// adds the stages' sums in sg.to order, and the producer then adds its local
// consumers'. That equals the single-process sum (addition being
// commutative but not associative) when the first stage in the order holds
// the latest consumers and every later term is a single contribution.
func (sg *stageGraph) gradientOrder(pos map[string]int) error {
	g := sg.g
	cons := g.Consumers()
	for s := range sg.outputs {
		for _, t := range sg.outputs[s] {
			var stages []int
			last := map[int]int{}
			for _, c := range cons[t] {
				cs := sg.stage[pos[c]]
				if cs == s {
					continue
				}
				if _, ok := last[cs]; !ok {
					stages = append(stages, cs)
				}
				last[cs] = max(last[cs], pos[c])
			}
			sort.Slice(stages, func(a, b int) bool { return last[stages[a]] > last[stages[b]] })
			sg.to[s] = append(sg.to[s], stages)
			if !g.Node(t).RequiresGrad || len(cons[t]) < 3 {
				continue // two terms add the same way in either order
			}
			// r: consumers in the order one process adds them.
			r := slices.Clone(cons[t])
			slices.Reverse(r)
			var terms [][]string
			for _, cs := range stages {
				var term []string
				for _, c := range r {
					if sg.stage[pos[c]] == cs {
						term = append(term, c)
					}
				}
				terms = append(terms, term)
			}
			for _, c := range r {
				if sg.stage[pos[c]] == s {
					terms = append(terms, []string{c})
				}
			}
			if !foldMatches(terms, r) {
				return fmt.Errorf("%w: tensor %q of stage %d is read by layers %v in stages %v; its gradient would be summed in another order than in one process",
					ErrGradientOrder, t, s, cons[t], stagesOf(sg, pos, cons[t]))
			}
		}
	}
	return nil
}

// foldMatches reports whether adding the terms left to right (each term a
// left fold of its own elements) gives the same expression, up to
// commutativity, as the left fold of r.
func foldMatches(terms [][]string, r []string) bool {
	same := func(a, b []string) bool {
		x, y := slices.Clone(a), slices.Clone(b)
		slices.Sort(x)
		slices.Sort(y)
		return slices.Equal(x, y)
	}
	k := len(terms[0])
	start := 1
	if k == 1 && len(terms) >= 2 {
		if len(terms[1]) != 1 {
			return false
		}
		k, start = 2, 2
		if !same(append(slices.Clone(terms[0]), terms[1]...), r[:2]) {
			return false
		}
	} else if k > len(r) || !slices.Equal(terms[0], r[:k]) {
		return false
	}
	for i := start; i < len(terms); i++ {
		if len(terms[i]) != 1 || k >= len(r) || terms[i][0] != r[k] {
			return false
		}
		k++
	}
	return k == len(r)
}

func stagesOf(sg *stageGraph, pos map[string]int, names []string) []int {
	var out []int
	for _, n := range names {
		out = append(out, sg.stage[pos[n]])
	}
	return out
}

func sortedKeys(m map[string]int) []string {
	var k []string
	for s := range m {
		k = append(k, s)
	}
	sort.Strings(k)
	return k
}

// isPath reports whether every stage k feeds stage k+1, so that the stages
// form a pipeline in their numbering (1F1B's requirement).
func (sg *stageGraph) isPath() bool {
	for k := 0; k+1 < len(sg.succ); k++ {
		if !slices.Contains(sg.succ[k], k+1) {
			return false
		}
	}
	for k := range sg.succ {
		for _, t := range sg.succ[k] {
			if t <= k {
				return false
			}
		}
	}
	return true
}
