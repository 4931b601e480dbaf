package balance

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/ppnode/ppnode/nn"
)

// Schedule is the order in which a stage runs its micro-batches.
type Schedule int

//go:generate stringer -type=Schedule,Op -linecomment -output=enum_string.go
const (
	// GPipe runs all forward passes, then all backward passes (fill-drain).
	GPipe Schedule = iota // gpipe
	// OneFOneB is synchronous 1F1B (PipeDream-flush): stage k of S runs
	// min(S-k-1, M) forward passes, then alternates one forward and one
	// backward pass, then drains. At most S-k micro-batches are in flight.
	OneFOneB // 1f1b
	// GraphSchedule is 1F1B on a DAG of stages (GraphPipe): a stage whose
	// longest path to the last stage has d stages warms up with min(d-1, M)
	// forward passes. On a chain it is 1F1B.
	GraphSchedule // graph
)

// ParseSchedule reads "gpipe", "1f1b" or "graph".
func ParseSchedule(s string) (Schedule, error) {
	for _, k := range []Schedule{GPipe, OneFOneB, GraphSchedule} {
		if k.String() == s {
			return k, nil
		}
	}
	return 0, fmt.Errorf("%w: unknown schedule %q (want gpipe, 1f1b or graph)", ErrPlan, s)
}

func (s Schedule) MarshalText() ([]byte, error) { return []byte(s.String()), nil }
func (s *Schedule) UnmarshalText(b []byte) error {
	v, err := ParseSchedule(string(b))
	*s = v
	return err
}

// Op is one instruction of a stage's program.
type Op int

const (
	// OpRecvAct waits for the named activations of micro-batch Micro from
	// stage Peer (or the coordinator's data).
	OpRecvAct Op = iota // recv_act
	// OpForward runs the stage's forward pass of micro-batch Micro (in the
	// nn.Stage slot the runtime keeps for it).
	OpForward // forward
	// OpLoss computes, on the loss stage, the loss of micro-batch Micro
	// from the graph output and the labels, and the output's gradient.
	OpLoss // loss
	// OpSendAct sends the named outputs of micro-batch Micro to stage
	// Peer. Sends do not wait for the transfer.
	OpSendAct // send_act
	// OpRecvGrad waits for the gradients of the named outputs from Peer.
	OpRecvGrad // recv_grad
	// OpBackward runs the backward pass of micro-batch Micro, adding to
	// the parameters' gradients.
	OpBackward // backward
	// OpSendGrad sends the gradients of the named inputs to stage Peer.
	OpSendGrad // send_grad
	// OpStep applies the optimizer to the stage's parameters (the flush).
	OpStep // step
)

// ParseOp reads an Op's name.
func ParseOp(s string) (Op, error) {
	for k := OpRecvAct; k <= OpStep; k++ {
		if k.String() == s {
			return k, nil
		}
	}
	return 0, fmt.Errorf("%w: unknown instruction %q", ErrPlan, s)
}

func (o Op) MarshalText() ([]byte, error) { return []byte(o.String()), nil }
func (o *Op) UnmarshalText(b []byte) error {
	v, err := ParseOp(string(b))
	*o = v
	return err
}

func (o Op) transfer() bool {
	return o == OpRecvAct || o == OpSendAct || o == OpRecvGrad || o == OpSendGrad
}

// Instr is one instruction. Peer and Tensors are set for transfers only;
// Micro for all but OpStep.
type Instr struct {
	Op      Op
	Micro   int
	Peer    int
	Tensors []string
}

type instrJSON struct {
	Op      Op       `json:"op"`
	Micro   *int     `json:"micro,omitempty"`
	Peer    *int     `json:"peer,omitempty"`
	Tensors []string `json:"tensors,omitempty"`
}

func (in Instr) MarshalJSON() ([]byte, error) {
	j := instrJSON{Op: in.Op}
	if in.Op != OpStep {
		j.Micro = &in.Micro
	}
	if in.Op.transfer() {
		j.Peer = &in.Peer
		j.Tensors = in.Tensors
	}
	return json.Marshal(j)
}

func (in *Instr) UnmarshalJSON(b []byte) error {
	var j instrJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	*in = Instr{Op: j.Op, Tensors: j.Tensors}
	if j.Micro != nil {
		in.Micro = *j.Micro
	}
	if j.Peer != nil {
		in.Peer = *j.Peer
	}
	return nil
}

func (in Instr) String() string {
	switch {
	case in.Op == OpStep:
		return "step"
	case in.Op.transfer():
		return fmt.Sprintf("%s %d peer=%d %v", in.Op, in.Micro, in.Peer, in.Tensors)
	}
	return fmt.Sprintf("%s %d", in.Op, in.Micro)
}

// Plan is everything the runtime needs to train a model as a pipeline:
// the stages, where each runs, what crosses between them, and each
// stage's program. It is JSON; Hash identifies it.
type Plan struct {
	// Format is the plan format's version (1).
	Format int    `json:"format"`
	Model  string `json:"model,omitempty"`
	// Graph is the GraphHash of the model.
	Graph       string   `json:"graph"`
	Partitioner string   `json:"partitioner,omitempty"`
	Schedule    Schedule `json:"schedule"`
	// MicroBatches is M; MicroBatchSize the samples in each.
	MicroBatches   int         `json:"micro_batches"`
	MicroBatchSize int         `json:"micro_batch_size"`
	Stages         []StagePlan `json:"stages"`
}

// StagePlan is one stage.
type StagePlan struct {
	ID   int    `json:"id"`
	Node string `json:"node"`
	// Layers are the stage's layers in the model's topological order; the
	// runtime runs them as g.Stage(Layers).
	Layers []string `json:"layers"`
	// Inputs and Outputs are in the order of the nn.Stage's Inputs and
	// Outputs.
	Inputs  []StageInput  `json:"inputs"`
	Outputs []StageOutput `json:"outputs"`
	// Loss marks the stage that holds the graph output: it gets each
	// micro-batch's labels from the coordinator and runs OpLoss.
	Loss    bool    `json:"loss,omitempty"`
	Program []Instr `json:"program"`
}

// StageInput is a tensor the stage reads from another stage or, with From
// = Coordinator, from the data. Grad is set when the stage sends its
// gradient back.
type StageInput struct {
	Name string `json:"name"`
	From int    `json:"from"`
	Grad bool   `json:"grad"`
}

// StageOutput is a tensor the stage sends to the stages To. If Grad is
// set, each of them sends back a gradient, and the runtime sums them in
// the order of To as a left fold, ((g[To[0]] + g[To[1]]) + g[To[2]]) ...,
// before passing the sum to the stage's backward pass: that is the order
// in which one process sums them, so the result is bit-identical. (A
// gradient that nn returns as nil is sent as zeros.) The graph output has
// an empty To: its gradient comes from the loss.
type StageOutput struct {
	Name string `json:"name"`
	To   []int  `json:"to"`
	Grad bool   `json:"grad"`
}

// Hash returns the SHA-256 of the plan's JSON, in hex: the same plan
// always hashes the same (fields are written in a fixed order).
func (p *Plan) Hash() string {
	b, err := json.Marshal(p)
	if err != nil {
		panic(err) // unreachable: a Plan always marshals
	}
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

// Partition returns the plan's partition.
func (p *Plan) Partition() *Partition {
	q := &Partition{}
	for _, s := range p.Stages {
		q.Stages = append(q.Stages, PartStage{Node: s.Node, Layers: slices.Clone(s.Layers)})
	}
	return q
}

// Build makes the plan that runs partition part of g with schedule sched
// and M micro-batches of b samples. nodes are the cluster's node names.
func Build(g *nn.Graph, part *Partition, nodes []string, sched Schedule, M, b int) (*Plan, error) {
	idx := map[string]int{}
	for i, n := range nodes {
		idx[n] = i
	}
	sg, err := newStageGraph(g, part, idx)
	if err != nil {
		return nil, err
	}
	return sg.plan(sched, M, b)
}

func (sg *stageGraph) plan(sched Schedule, M, b int) (*Plan, error) {
	g := sg.g
	if M < 1 || b < 1 {
		return nil, fmt.Errorf("%w: %d micro-batches of %d samples", ErrPlan, M, b)
	}
	if sched == OneFOneB && !sg.isPath() {
		return nil, fmt.Errorf("%w: 1f1b needs stages that form a chain s0 -> s1 -> ...; use the graph schedule", ErrPlan)
	}
	if sched < GPipe || sched > GraphSchedule {
		return nil, fmt.Errorf("%w: unknown schedule %d", ErrPlan, sched)
	}
	p := &Plan{Format: 1, Graph: GraphHash(g), Schedule: sched, MicroBatches: M, MicroBatchSize: b}
	S := len(sg.layers)
	pos := map[string]int{}
	for i, n := range g.Nodes {
		pos[n.Name] = i
	}
	for s := 0; s < S; s++ {
		st := StagePlan{ID: s, Node: sg.part.Stages[s].Node, Loss: s == sg.loss}
		for _, i := range sg.layers[s] {
			st.Layers = append(st.Layers, g.Nodes[i].Name)
		}
		for k, t := range sg.inputs[s] {
			st.Inputs = append(st.Inputs, StageInput{Name: t, From: sg.from[s][k], Grad: !g.IsInput(t) && g.Node(t).RequiresGrad})
		}
		for k, t := range sg.outputs[s] {
			to := slices.Clone(sg.to[s][k])
			if to == nil {
				to = []int{}
			}
			st.Outputs = append(st.Outputs, StageOutput{Name: t, To: to, Grad: g.Node(t).RequiresGrad && len(to) > 0})
		}
		p.Stages = append(p.Stages, st)
	}
	for s := range p.Stages {
		p.Stages[s].Program = program(&p.Stages[s], sched, M, sg.depth[s], pos)
	}
	return p, nil
}

// program writes stage st's instruction list. The tensors of one message
// are listed in the model's node order (pos), on both ends.
func program(st *StagePlan, sched Schedule, M, depth int, pos map[string]int) []Instr {
	// Peers in a fixed order: coordinator first, then ascending stage.
	var inPeers, outPeers, gradIn, gradOut []int
	for _, in := range st.Inputs {
		if !slices.Contains(inPeers, in.From) {
			inPeers = append(inPeers, in.From)
		}
		if in.Grad && in.From != Coordinator && !slices.Contains(gradOut, in.From) {
			gradOut = append(gradOut, in.From)
		}
	}
	for _, out := range st.Outputs {
		for _, t := range out.To {
			if !slices.Contains(outPeers, t) {
				outPeers = append(outPeers, t)
			}
			if out.Grad && !slices.Contains(gradIn, t) {
				gradIn = append(gradIn, t)
			}
		}
	}
	for _, s := range [][]int{inPeers, outPeers, gradIn, gradOut} {
		slices.Sort(s)
	}
	inputsFrom := func(peer int, grad bool) []string {
		var n []string
		for _, in := range st.Inputs {
			if in.From == peer && (!grad || in.Grad) {
				n = append(n, in.Name)
			}
		}
		slices.SortStableFunc(n, func(a, b string) int { return pos[a] - pos[b] })
		return n
	}
	outputsTo := func(peer int, grad bool) []string {
		var n []string
		for _, out := range st.Outputs {
			if slices.Contains(out.To, peer) && (!grad || out.Grad) {
				n = append(n, out.Name)
			}
		}
		return n
	}
	var prog []Instr
	fwd := func(m int) {
		for _, q := range inPeers {
			prog = append(prog, Instr{Op: OpRecvAct, Micro: m, Peer: q, Tensors: inputsFrom(q, false)})
		}
		prog = append(prog, Instr{Op: OpForward, Micro: m})
		if st.Loss {
			prog = append(prog, Instr{Op: OpLoss, Micro: m})
		}
		for _, q := range outPeers {
			prog = append(prog, Instr{Op: OpSendAct, Micro: m, Peer: q, Tensors: outputsTo(q, false)})
		}
	}
	bwd := func(m int) {
		for _, q := range gradIn {
			prog = append(prog, Instr{Op: OpRecvGrad, Micro: m, Peer: q, Tensors: outputsTo(q, true)})
		}
		prog = append(prog, Instr{Op: OpBackward, Micro: m})
		for _, q := range gradOut {
			prog = append(prog, Instr{Op: OpSendGrad, Micro: m, Peer: q, Tensors: inputsFrom(q, true)})
		}
	}
	switch sched {
	case GPipe:
		for m := 0; m < M; m++ {
			fwd(m)
		}
		for m := 0; m < M; m++ {
			bwd(m)
		}
	default:
		w := min(depth-1, M)
		for m := 0; m < w; m++ {
			fwd(m)
		}
		for m := 0; m+w < M; m++ {
			fwd(m + w)
			bwd(m)
		}
		for m := M - w; m < M; m++ {
			bwd(m)
		}
	}
	return append(prog, Instr{Op: OpStep})
}

// Validate checks a plan against the model: its partition (Partition.
// Validate), that every stage's inputs, outputs and gradient orders are
// what Build derives, and that every program runs each micro-batch's
// forward and backward pass once, backward passes in ascending order, the
// optimizer step last, with every send matched by a receive, and that the
// programs do not deadlock. A plan read from the network or disk must pass
// it before it runs.
func (p *Plan) Validate(g *nn.Graph) error {
	if p.Format != 1 {
		return fmt.Errorf("%w: format %d (want 1)", ErrPlan, p.Format)
	}
	if p.Graph != GraphHash(g) {
		return fmt.Errorf("%w: plan is for graph %s, model is %s", ErrPlan, p.Graph, GraphHash(g))
	}
	var nodes []string
	for i, s := range p.Stages {
		if s.ID != i {
			return fmt.Errorf("%w: stage %d has id %d", ErrPlan, i, s.ID)
		}
		nodes = append(nodes, s.Node)
	}
	want, err := Build(g, p.Partition(), nodes, p.Schedule, p.MicroBatches, p.MicroBatchSize)
	if err != nil {
		return err
	}
	for i := range p.Stages {
		a, b := p.Stages[i], want.Stages[i]
		if !slices.Equal(a.Layers, b.Layers) {
			return fmt.Errorf("%w: stage %d lists its layers out of topological order", ErrPlan, i)
		}
		if a.Loss != b.Loss || !slices.Equal(a.Inputs, b.Inputs) || !slices.EqualFunc(a.Outputs, b.Outputs, func(x, y StageOutput) bool {
			return x.Name == y.Name && x.Grad == y.Grad && slices.Equal(x.To, y.To)
		}) {
			return fmt.Errorf("%w: stage %d's inputs, outputs or loss flag differ from its layers' boundary", ErrPlan, i)
		}
		if err := checkProgram(&a, p.MicroBatches); err != nil {
			return err
		}
	}
	// Matched transfers and no deadlock: replay with unit costs.
	if _, err := replay(p, unitCosts{}); err != nil {
		return err
	}
	return nil
}

// checkProgram checks one stage's program for the invariants the runtime
// relies on.
func checkProgram(st *StagePlan, M int) error {
	fwd := make([]int, M)
	nextB := 0
	for k, in := range st.Program {
		if in.Op != OpStep && (in.Micro < 0 || in.Micro >= M) {
			return fmt.Errorf("%w: stage %d instruction %d (%v): micro-batch out of range", ErrPlan, st.ID, k, in)
		}
		switch in.Op {
		case OpForward:
			fwd[in.Micro]++
		case OpBackward:
			if in.Micro != nextB {
				return fmt.Errorf("%w: stage %d runs backward %d where backward %d is due (backward passes must be in ascending order)", ErrPlan, st.ID, in.Micro, nextB)
			}
			if fwd[in.Micro] != 1 {
				return fmt.Errorf("%w: stage %d runs backward %d before its forward", ErrPlan, st.ID, in.Micro)
			}
			nextB++
		case OpStep:
			if k != len(st.Program)-1 {
				return fmt.Errorf("%w: stage %d steps the optimizer before its last instruction", ErrPlan, st.ID)
			}
		case OpLoss:
			if !st.Loss {
				return fmt.Errorf("%w: stage %d computes a loss but holds no graph output", ErrPlan, st.ID)
			}
		}
	}
	for m, n := range fwd {
		if n != 1 {
			return fmt.Errorf("%w: stage %d runs forward %d %d times", ErrPlan, st.ID, m, n)
		}
	}
	if nextB != M || len(st.Program) == 0 || st.Program[len(st.Program)-1].Op != OpStep {
		return fmt.Errorf("%w: stage %d does not run every backward pass and then the optimizer step", ErrPlan, st.ID)
	}
	return nil
}

// Sequential reports whether the plan's stages form a chain, each stage
// feeding the next (a tensor may also skip ahead): a sequential pipeline,
// as opposed to a DAG of stages of which some run side by side.
func (p *Plan) Sequential() bool {
	for k, st := range p.Stages {
		fed := k == 0
		for _, in := range st.Inputs {
			if in.From >= k {
				return false
			}
			if in.From == k-1 {
				fed = true
			}
		}
		if !fed {
			return false
		}
	}
	return true
}
