package balance

import (
	"fmt"
	"slices"
)

// Pass is one forward or backward pass of a node's interleaved program:
// of micro-batch Micro through the node's chunk Chunk (its stage
// Chunk×P + i on node i of P).
type Pass struct {
	Chunk    int
	Micro    int
	Backward bool
}

func (ps Pass) String() string {
	if ps.Backward {
		return fmt.Sprintf("B%d.%d", ps.Chunk, ps.Micro)
	}
	return fmt.Sprintf("F%d.%d", ps.Chunk, ps.Micro)
}

// InterleavedOrder returns the passes of node i of P, holding v chunks,
// for M micro-batches, in the order of Megatron-LM's interleaved 1F1B
// (forward_backward_pipelining_with_interleaving): the node runs M×v
// virtual micro-batches; the k-th forward one is micro-batch
// (k div P·v)·P + k mod P of chunk (k mod P·v) div P, the k-th backward
// one the same micro-batch of chunk v-1 minus that, so chunks alternate
// in groups of P micro-batches. It warms up with min((P-i-1)·2 +
// (v-1)·P, M·v) forward passes, then alternates one forward and one
// backward pass, then drains the backward passes. Each chunk's backward
// passes come in ascending micro-batch order. M must be a multiple of P.
func InterleavedOrder(P, v, i, M int) ([]Pass, error) {
	if P < 2 || v < 2 || i < 0 || i >= P || M < 1 {
		return nil, fmt.Errorf("%w: interleaved order of node %d of %d with %d chunks and %d micro-batches", ErrPlan, i, P, v, M)
	}
	if M%P != 0 {
		return nil, fmt.Errorf("%w: interleaved 1F1B needs a multiple of the %d nodes as micro-batches, not %d", ErrPlan, P, M)
	}
	total := M * v
	virtual := func(k int, backward bool) Pass {
		c := k % (P * v) / P
		if backward {
			c = v - 1 - c
		}
		return Pass{Chunk: c, Micro: k/(P*v)*P + k%P, Backward: backward}
	}
	warm := min((P-i-1)*2+(v-1)*P, total)
	out := make([]Pass, 0, 2*total)
	for k := 0; k < warm; k++ {
		out = append(out, virtual(k, false))
	}
	for k := 0; k+warm < total; k++ {
		out = append(out, virtual(k+warm, false), virtual(k, true))
	}
	for k := total - warm; k < total; k++ {
		out = append(out, virtual(k, true))
	}
	return out, nil
}

// ScheduleText names the plan's schedule for people: "1f1b", or
// "interleaved (2 chunks per node)".
func (p *Plan) ScheduleText() string {
	if p.Schedule == Interleaved {
		return fmt.Sprintf("%s (%d chunks per node)", p.Schedule, p.Chunks)
	}
	return p.Schedule.String()
}

// Slot is one instruction of an executor's order: instruction PC of stage
// Stage's program.
type Slot struct {
	Stage int `json:"stage"`
	PC    int `json:"pc"`
}

// NodeOrder returns the order in which node runs the instructions of its
// stages. Under the interleaved schedule that is its chunks' programs
// merged pass by pass in InterleavedOrder (a pass: its receives, its
// forward or backward pass, and the loss and sends after it), then each
// chunk's remaining instructions (tied gradients, the optimizer step) in
// chunk order, a chunk's tie receives after every chunk's sends: the
// node is one executor, and its chunks never run at the same time.
// Otherwise it is the program of the node's stage (nil if it has none;
// the stages of a node without interleaving are one executor each).
func (p *Plan) NodeOrder(node string) ([]Slot, error) {
	if p.Schedule != Interleaved {
		for _, st := range p.Stages {
			if st.Node == node {
				out := make([]Slot, len(st.Program))
				for k := range out {
					out[k] = Slot{st.ID, k}
				}
				return out, nil
			}
		}
		return nil, nil
	}
	v := p.Chunks
	if v < 2 || len(p.Stages)%v != 0 || len(p.Stages)/v < 2 {
		return nil, fmt.Errorf("%w: an interleaved plan of %d stages with %d chunks per node", ErrPlan, len(p.Stages), v)
	}
	P := len(p.Stages) / v
	i := slices.IndexFunc(p.Stages[:P], func(st StagePlan) bool { return st.Node == node })
	if i < 0 {
		return nil, nil
	}
	passes, err := InterleavedOrder(P, v, i, p.MicroBatches)
	if err != nil {
		return nil, err
	}
	pcs := make([]int, v)
	var out []Slot
	for _, ps := range passes {
		s := ps.Chunk*P + i
		prog := p.Stages[s].Program
		want := OpForward
		if ps.Backward {
			want = OpBackward
		}
		found := false
		for pcs[ps.Chunk] < len(prog) && !found {
			in := prog[pcs[ps.Chunk]]
			found = in.Op == want
			if found && in.Micro != ps.Micro {
				return nil, fmt.Errorf("%w: stage %d runs %v where node %s's interleaved order has %v", ErrPlan, s, in, node, ps)
			}
			out = append(out, Slot{s, pcs[ps.Chunk]})
			pcs[ps.Chunk]++
		}
		if !found {
			return nil, fmt.Errorf("%w: stage %d's program has no %v (node %s's interleaved order)", ErrPlan, s, ps, node)
		}
		for pcs[ps.Chunk] < len(prog) {
			if op := prog[pcs[ps.Chunk]].Op; op != OpLoss && op != OpSendAct && op != OpSendGrad {
				break
			}
			out = append(out, Slot{s, pcs[ps.Chunk]})
			pcs[ps.Chunk]++
		}
	}
	// The rest in two rounds: every chunk up to its tie receives, whose
	// sends may come from another chunk of the node, then the receives
	// and the step.
	for _, recvs := range []bool{false, true} {
		for c := range v {
			s := c*P + i
			prog := p.Stages[s].Program
			for ; pcs[c] < len(prog) && (recvs || prog[pcs[c]].Op != OpRecvTie); pcs[c]++ {
				out = append(out, Slot{s, pcs[c]})
			}
		}
	}
	return out, nil
}

// executors returns the plan's executors, each the order of the
// instructions it runs: a node under the interleaved schedule, a stage
// (or replica) otherwise.
func (p *Plan) executors() ([][]Slot, error) {
	if p.Schedule != Interleaved {
		out := make([][]Slot, len(p.Stages))
		for s, st := range p.Stages {
			for k := range st.Program {
				out[s] = append(out[s], Slot{s, k})
			}
		}
		return out, nil
	}
	if p.Chunks < 2 || len(p.Stages)%p.Chunks != 0 {
		return nil, fmt.Errorf("%w: an interleaved plan of %d stages with %d chunks per node", ErrPlan, len(p.Stages), p.Chunks)
	}
	var out [][]Slot
	for _, st := range p.Stages[:len(p.Stages)/p.Chunks] {
		o, err := p.NodeOrder(st.Node)
		if err != nil {
			return nil, err
		}
		out = append(out, o)
	}
	return out, nil
}

// interleavedPartition cuts the model's units into P×v runs, run s on
// node s mod P (nodes in the given order), minimising the largest run's
// compute time at its node's speed (exact, O(U² P v)); nil when the model
// has fewer than P×v units.
func interleavedPartition(l *layout, c *costs, net *network, v int) *Partition {
	P := len(net.nodes)
	S := P * v
	U := len(l.units)
	if U < S {
		return nil
	}
	cuts := minMaxCuts(c.work, S, func(k int) float64 { return net.nodes[k%P].Speed })
	part := &Partition{Chunks: v}
	for k := 0; k < S; k++ {
		part.Stages = append(part.Stages, PartStage{Node: net.nodes[k%P].Name, Layers: l.unitNames(cuts[k], cuts[k+1])})
	}
	return part
}

// uniformChunks gives each of the P×v stages an equal share of the units,
// stage s on node s mod P; nil when there are fewer units than stages.
func uniformChunks(l *layout, nodes []string, v int) *Partition {
	U, S := len(l.units), len(nodes)*v
	if U < S {
		return nil
	}
	part := &Partition{Chunks: v}
	for k := 0; k < S; k++ {
		part.Stages = append(part.Stages, PartStage{Node: nodes[k%len(nodes)], Layers: l.unitNames(k*U/S, (k+1)*U/S)})
	}
	return part
}

// InterleavedChunks are the chunks per node Search tries under the
// interleaved schedule when Options.Chunks is 0.
var InterleavedChunks = []int{2, 3, 4}

// searchInterleaved is Search under the interleaved schedule: for each
// chunk count and each M that is a multiple of the nodes, the balanced
// (or uniform) cut into P×v stages, simulated; the fastest that fits.
func searchInterleaved(l *layout, net *network, slots int, o Options, Ms []int) (*Result, error) {
	g := l.g
	P := len(net.nodes)
	if P < 2 {
		return nil, fmt.Errorf("%w: interleaved 1F1B needs 2 nodes at least, the cluster has %d", ErrPlan, P)
	}
	var fixed *Partition
	switch o.Partitioner {
	case Balanced, GraphPP, Uniform:
	case Params:
		return nil, fmt.Errorf("%w: the interleaved schedule cuts the model by time (partitioner balanced or uniform, or a description), not by parameters", ErrPlan)
	default:
		var nodes []string
		for _, n := range net.nodes {
			nodes = append(nodes, n.Name)
		}
		var err error
		if fixed, err = ParseSpec(g, o.Partitioner, nodes); err != nil {
			return nil, err
		}
		if fixed.Chunks < 2 || o.Chunks != 0 && o.Chunks != fixed.Chunks {
			return nil, fmt.Errorf("%w: the description gives %d chunks per node (name P nodes in a cycle for P×v stages) and the schedule wants %d", ErrPlan, max(fixed.Chunks, 1), max(o.Chunks, 2))
		}
		P = fixed.chunkNodes()
		o.Chunks = fixed.Chunks
	}
	if o.Recompute != RecomputeNone {
		return nil, fmt.Errorf("%w: the interleaved schedule does not recompute activations (--recompute %s)", ErrPlan, o.Recompute)
	}
	chunks := InterleavedChunks
	if o.Chunks != 0 {
		if o.Chunks < 2 {
			return nil, fmt.Errorf("%w: %d chunks per node (interleaving needs 2 at least)", ErrPlan, o.Chunks)
		}
		chunks = []int{o.Chunks}
	}
	var ms []int
	for _, M := range Ms {
		if M%P == 0 {
			ms = append(ms, M)
		}
	}
	if len(ms) == 0 {
		if o.MicroBatches > 0 {
			return nil, fmt.Errorf("%w: interleaved 1F1B needs micro-batches in a multiple of the nodes: %d micro-batches on %d nodes (try %d)", ErrPlan, o.MicroBatches, P, P*max(1, (o.MicroBatches+P-1)/P))
		}
		return nil, fmt.Errorf("%w: interleaved 1F1B needs micro-batches in a multiple of the %d nodes, and none of %v is", ErrPlan, P, Ms)
	}
	var nodes []string
	for _, n := range net.nodes {
		nodes = append(nodes, n.Name)
	}
	var bestFit, bestAny *candidate
	simulated, tooFew, notChain := 0, 0, 0
	for _, v := range chunks {
		for _, M := range ms {
			b := o.Batch / M
			part := fixed
			switch {
			case fixed != nil:
			case o.Partitioner == Uniform:
				part = uniformChunks(l, nodes, v)
			default:
				part = interleavedPartition(l, l.costsFor(b, slots), net, v)
			}
			if part == nil {
				tooFew++
				continue
			}
			sg, err := newStageGraph(g, part, net.index)
			if err != nil {
				notChain++
				continue
			}
			if !sg.isPath() {
				notChain++
				continue
			}
			plan, err := sg.plan(Interleaved, M, b, false, nil)
			if err != nil {
				return nil, err
			}
			plan.Model, plan.Partitioner = o.Model, o.Partitioner
			if fixed != nil {
				plan.Partitioner = "spec"
			}
			rep, err := simulate(plan, l, net, slots)
			if err != nil {
				return nil, err
			}
			simulated++
			cd := &candidate{plan: plan, rep: rep, sg: sg}
			if cd.fits() {
				if bestFit == nil || cd.better(bestFit) {
					bestFit = cd
				}
			} else if bestAny == nil || cd.overuse() < bestAny.overuse() {
				bestAny = cd
			}
		}
	}
	switch {
	case simulated == 0 && tooFew > 0 && notChain == 0:
		return nil, fmt.Errorf("%w: the model has %d units (layers with what attaches to them), too few for %d nodes × %v chunks", ErrPlan, len(l.units), P, chunks)
	case simulated == 0:
		return nil, fmt.Errorf("%w: the interleaved schedule needs stages that form a chain, and the model does not cut into %d nodes × %v chunks that do (a DAG model: use --schedule graph)", ErrPlan, P, chunks)
	case bestFit == nil:
		return nil, fmt.Errorf("%w: no interleaved plan fits the nodes' memory (closest: %d chunks, M=%d, %.0f%% of a node's memory)", ErrNoFit, bestAny.plan.Chunks, bestAny.plan.MicroBatches, 100*bestAny.overuse())
	}
	return &Result{Plan: bestFit.plan, Report: bestFit.rep, Spec: FormatSpec(g, bestFit.sg.part), Simulated: simulated}, nil
}
