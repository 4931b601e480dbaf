package balance

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"

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
	// ZeroBubble is zero-bubble pipelining (Qi et al., ICLR 2024, ZB-H1)
	// on a chain of stages: 1F1B's order and micro-batches in flight, each
	// backward pass split into the input gradients (OpBackwardInput), sent
	// upstream at once, and the weight gradients (OpWeight), run after it
	// in micro-batch order, which fills the drain's bubble.
	ZeroBubble // zb
	// Interleaved is interleaved 1F1B (Megatron-LM, Narayanan et al., SC
	// 2021) on a chain of P×v stages: node i holds the v non-adjacent
	// stages (chunks) i, i+P, i+2P, ... and runs them as one executor in
	// the order InterleavedOrder gives, which shrinks 1F1B's bubble from
	// (P-1)/M to (P-1)/(v·M) of the ideal step. M is a multiple of P.
	Interleaved // interleaved
)

// ParseSchedule reads "gpipe", "1f1b", "graph", "zb" or "interleaved".
func ParseSchedule(s string) (Schedule, error) {
	for _, k := range []Schedule{GPipe, OneFOneB, GraphSchedule, ZeroBubble, Interleaved} {
		if k.String() == s {
			return k, nil
		}
	}
	return 0, fmt.Errorf("%w: unknown schedule %q (want gpipe, 1f1b, graph, zb or interleaved)", ErrPlan, s)
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
	// OpRecvSum waits for the sum of the stage's parameter gradients (all
	// its trainable parameters, in the nn.Stage's order) from Peer, another
	// replica of the stage. From the replica before this one it is the sum
	// of the replicas before (the prefix): received before the replica's
	// first backward pass (Plan.ChainedSums) it becomes the gradients the
	// backward passes add to, as in one process; received after the last
	// it is added in front, prefix + own. From the last replica it is the
	// total, which replaces the replica's gradients.
	OpRecvSum // recv_sum
	// OpSendSum sends the replica's parameter gradients, the sum so far
	// (see OpRecvSum), to Peer, another replica of the stage.
	OpSendSum // send_sum
	// OpRecompute runs the forward pass of micro-batch Micro again from
	// its inputs, on a stage that keeps only its inputs between its
	// forward and backward passes (StagePlan.Recompute); the backward pass
	// of Micro is the next pass the stage runs.
	OpRecompute // recompute
	// OpBackwardInput runs the first half of micro-batch Micro's backward
	// pass (nn.Stage.BackwardInput): the input gradients, and the
	// parameter gradients of the layers that cannot split.
	OpBackwardInput // backward_input
	// OpWeight runs the second half (nn.Stage.BackwardWeight): the
	// parameter gradients it left. Weight passes run in micro-batch order,
	// each after its OpBackwardInput.
	OpWeight // weight
	// OpSendTie sends, after the stage's gradients are summed, the
	// gradients of the tied parameters (nn.Ties) of the layers Tensors
	// names to Peer, an executor of another stage that holds a copy.
	OpSendTie // send_tie
	// OpRecvTie waits for them from Peer. At OpStep each copy of a tied
	// tensor takes the sum of all copies' gradients in node order, the
	// order in which one process adds them.
	OpRecvTie // recv_tie
)

// ParseOp reads an Op's name.
func ParseOp(s string) (Op, error) {
	for k := OpRecvAct; k <= OpRecvTie; k++ {
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

// perMicro reports whether o names a micro-batch.
func (o Op) perMicro() bool { return o != OpStep && !o.sum() && !o.tie() }

func (o Op) transfer() bool {
	return o == OpRecvAct || o == OpSendAct || o == OpRecvGrad || o == OpSendGrad
}

// sum reports whether o moves a replica's parameter gradients.
func (o Op) sum() bool { return o == OpRecvSum || o == OpSendSum }

// tie reports whether o moves tied parameters' gradients between stages.
func (o Op) tie() bool { return o == OpSendTie || o == OpRecvTie }

// Instr is one instruction. Peer is set for transfers, sums and ties,
// Tensors for transfers (a sum carries all the stage's trainable
// parameters) and ties (the layers whose tied parameters it carries);
// Micro for all but OpStep, the sums and the ties.
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
	if in.Op.perMicro() {
		j.Micro = &in.Micro
	}
	if in.Op.transfer() || in.Op.sum() || in.Op.tie() {
		j.Peer = &in.Peer
	}
	if in.Op.transfer() || in.Op.tie() {
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
	case in.Op.sum():
		return fmt.Sprintf("%s peer=%d", in.Op, in.Peer)
	case in.Op.tie():
		return fmt.Sprintf("%s peer=%d %v", in.Op, in.Peer, in.Tensors)
	case in.Op.transfer():
		return fmt.Sprintf("%s %d peer=%d %v", in.Op, in.Micro, in.Peer, in.Tensors)
	}
	return fmt.Sprintf("%s %d", in.Op, in.Micro)
}

// Plan is everything the runtime needs to train a model as a pipeline:
// the stages, where each runs, what crosses between them, and each
// stage's program. It is JSON; Hash identifies it.
//
// A stage of the partition with replicas becomes one entry of Stages (an
// executor) per node, with adjacent IDs: each replica runs its share of
// the micro-batches (StagePlan.Micros: the r-th block of consecutive ones
// with ChainedSums, else interleaved), through the stage's program
// restricted to them, and the replicas sum their parameter gradients in a
// chain before the optimizer step (OpRecvSum, OpSendSum).
// StageInput.From and StageOutput.To name stages of the partition
// (StagePlan.Group); an instruction's Peer names the executor.
type Plan struct {
	// Format is the plan format's version (1).
	Format int    `json:"format"`
	Model  string `json:"model,omitempty"`
	// Graph is the GraphHash of the model.
	Graph       string   `json:"graph"`
	Partitioner string   `json:"partitioner,omitempty"`
	Schedule    Schedule `json:"schedule"`
	// MicroBatches is M; MicroBatchSize the samples in each.
	MicroBatches   int `json:"micro_batches"`
	MicroBatchSize int `json:"micro_batch_size"`
	// ChainedSums orders the replicas' gradient sums as one process adds
	// the micro-batches' gradients, so that replicated training is
	// bit-identical to it: replica r receives the sum of replicas 0..r-1
	// before its first backward pass and adds its own to it, which makes
	// the replicas' backward passes wait for each other. Without it a
	// replica receives that sum after its last backward pass, and every
	// replica still ends with the same total, ((g0 + g1) + g2) ...
	ChainedSums bool `json:"chained_sums,omitempty"`
	// Chunks is v under the interleaved schedule (see Partition.Chunks):
	// stage s runs on the node of stage s mod (len(Stages)/v); 0 otherwise.
	Chunks int         `json:"chunks,omitempty"`
	Stages []StagePlan `json:"stages"`
}

// StagePlan is one stage, or one replica of a stage.
type StagePlan struct {
	ID int `json:"id"`
	// Group is the stage of the partition the executor runs (ID without
	// replicas; in JSON only where it differs from ID), Replica its index
	// among the stage's replicas.
	Group   int    `json:"-"`
	Replica int    `json:"replica,omitempty"`
	Node    string `json:"node"`
	// Layers are the stage's layers in the model's topological order; the
	// runtime runs them as g.Stage(Layers).
	Layers []string `json:"layers"`
	// Inputs and Outputs are in the order of the nn.Stage's Inputs and
	// Outputs.
	Inputs  []StageInput  `json:"inputs"`
	Outputs []StageOutput `json:"outputs"`
	// Loss marks the stage that holds the graph output: it gets each
	// micro-batch's labels from the coordinator and runs OpLoss.
	Loss bool `json:"loss,omitempty"`
	// Recompute makes the stage keep only its inputs (and what it sends)
	// of the micro-batches between their forward and backward passes, in
	// one set of activation buffers: each backward pass is preceded by
	// OpRecompute of its micro-batch. It trades a forward pass per
	// micro-batch for the memory of the activations in flight.
	Recompute bool    `json:"recompute,omitempty"`
	Program   []Instr `json:"program"`
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

type stagePlanFields StagePlan // StagePlan without its JSON methods

func (s StagePlan) MarshalJSON() ([]byte, error) {
	j := struct {
		ID      int  `json:"id"`
		Group   *int `json:"group,omitempty"`
		Replica int  `json:"replica,omitempty"`
		stagePlanFields
	}{ID: s.ID, Replica: s.Replica, stagePlanFields: stagePlanFields(s)}
	if s.Group != s.ID {
		j.Group = &s.Group
	}
	return json.Marshal(j)
}

func (s *StagePlan) UnmarshalJSON(b []byte) error {
	var j struct {
		Group *int `json:"group"`
		stagePlanFields
	}
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	*s = StagePlan(j.stagePlanFields)
	s.Group = s.ID
	if j.Group != nil {
		s.Group = *j.Group
	}
	return nil
}

// Micros returns the micro-batches the executor runs (those of its
// forward passes), ascending: all M for a stage without replicas.
func (s *StagePlan) Micros() []int {
	var out []int
	for _, in := range s.Program {
		if in.Op == OpForward {
			out = append(out, in.Micro)
		}
	}
	slices.Sort(out)
	return out
}

// Replicated reports whether a stage of the plan has replicas.
func (p *Plan) Replicated() bool {
	for _, s := range p.Stages {
		if s.Replica > 0 {
			return true
		}
	}
	return false
}

// Partition returns the plan's partition: one stage per group of
// executors, with the numbers of their micro-batches as shares unless
// those are the equal split.
func (p *Plan) Partition() *Partition {
	q := &Partition{Chunks: p.Chunks}
	var execs [][]int
	for k, s := range p.Stages {
		if s.Replica > 0 && len(q.Stages) > 0 {
			st := &q.Stages[len(q.Stages)-1]
			st.Replicas = append(st.Replicas, s.Node)
			execs[len(execs)-1] = append(execs[len(execs)-1], k)
			continue
		}
		q.Stages = append(q.Stages, PartStage{Node: s.Node, Layers: slices.Clone(s.Layers)})
		execs = append(execs, []int{k})
	}
	for gi, ex := range execs {
		if len(ex) == 1 {
			continue
		}
		shares := make([]int, len(ex))
		for r, k := range ex {
			shares[r] = len(p.Stages[k].Micros())
		}
		if !slices.Equal(shares, equalSplit(p.MicroBatches, len(ex))) {
			q.Stages[gi].Shares = shares
		}
	}
	return q
}

// Build makes the plan that runs partition part of g with schedule sched
// and M micro-batches of b samples. nodes are the cluster's node names. A
// stage with replicas gets an executor per node, which sum their
// gradients in the fast order (Search with Options.ChainedSums plans the
// deterministic order).
func Build(g *nn.Graph, part *Partition, nodes []string, sched Schedule, M, b int) (*Plan, error) {
	return buildPlan(g, part, nodes, sched, M, b, false)
}

func buildPlan(g *nn.Graph, part *Partition, nodes []string, sched Schedule, M, b int, chained bool) (*Plan, error) {
	return buildRecompute(g, part, nodes, sched, M, b, chained, nil)
}

// buildRecompute is buildPlan with the stages of the partition for which
// rec is set recomputing their activations.
func buildRecompute(g *nn.Graph, part *Partition, nodes []string, sched Schedule, M, b int, chained bool, rec []bool) (*Plan, error) {
	idx := map[string]int{}
	for i, n := range nodes {
		idx[n] = i
	}
	sg, err := newStageGraph(g, part, idx)
	if err != nil {
		return nil, err
	}
	return sg.plan(sched, M, b, chained, rec)
}

// plan writes the plan of the stage graph; rec, if not nil, says per stage
// of the partition whether it recomputes its activations.
func (sg *stageGraph) plan(sched Schedule, M, b int, chained bool, rec []bool) (*Plan, error) {
	g := sg.g
	if M < 1 || b < 1 {
		return nil, fmt.Errorf("%w: %d micro-batches of %d samples", ErrPlan, M, b)
	}
	if sched == OneFOneB && !sg.isPath() {
		return nil, fmt.Errorf("%w: 1f1b needs stages that form a chain s0 -> s1 -> ...; use the graph schedule", ErrPlan)
	}
	if sched < GPipe || sched > Interleaved {
		return nil, fmt.Errorf("%w: unknown schedule %d", ErrPlan, sched)
	}
	v := sg.part.Chunks
	if (sched == Interleaved) != (v > 1) {
		return nil, fmt.Errorf("%w: a partition with %d chunks per node under the %s schedule (chunks go with interleaved, and only there)", ErrPlan, v, sched)
	}
	if sched == Interleaved && (!sg.isPath() || slices.Contains(rec, true)) {
		return nil, fmt.Errorf("%w: interleaved needs stages that form a chain, without recomputation", ErrPlan)
	}
	if P := sg.part.chunkNodes(); sched == Interleaved && M%P != 0 {
		return nil, fmt.Errorf("%w: interleaved 1F1B needs micro-batches in a multiple of the %d nodes, not %d", ErrPlan, P, M)
	}
	if sched == ZeroBubble && (!sg.isPath() || sg.part.Replicated() || slices.Contains(rec, true)) {
		return nil, fmt.Errorf("%w: zb needs stages that form a chain, without replicas or recomputation", ErrPlan)
	}
	S := len(sg.layers)
	p := &Plan{Format: 1, Graph: GraphHash(g), Schedule: sched, MicroBatches: M, MicroBatchSize: b, ChainedSums: chained && sg.part.Replicated(), Chunks: max(v, 0)}
	// Executors: each stage's nodes in turn, IDs in order.
	execs := make([][]int, S)  // stage -> executor IDs
	execOf := make([][]int, S) // stage -> micro-batch -> executor ID
	var micros [][]int         // executor -> its micro-batches
	for s := 0; s < S; s++ {
		split, err := sg.part.Stages[s].split(s, M)
		if err != nil {
			return nil, err
		}
		for range split {
			execs[s] = append(execs[s], len(micros))
			micros = append(micros, nil)
		}
		execOf[s] = make([]int, M)
		for m, r := range assignMicros(split, p.ChainedSums) {
			id := execs[s][r]
			execOf[s][m] = id
			micros[id] = append(micros[id], m)
		}
	}
	pos := map[string]int{}
	for i, n := range g.Nodes {
		pos[n.Name] = i
	}
	// The warm-up counts the nodes on the longest path to the end, the
	// stage's own included: a stage runs ahead by as many micro-batches as
	// the replicas after it run at once, and an interleaved replica keeps
	// one of its own ahead (without replicas, the depth in stages).
	depth := make([]int, S)
	var nodeDepth func(s int) int
	nodeDepth = func(s int) int {
		if depth[s] == 0 {
			d := 0
			for _, t := range sg.succ[s] {
				d = max(d, nodeDepth(t))
			}
			depth[s] = d + 1 + len(sg.part.Stages[s].Replicas)
		}
		return depth[s]
	}
	for s := 0; s < S; s++ {
		ps := sg.part.Stages[s]
		for r, node := range ps.Nodes() {
			id := execs[s][r]
			st := StagePlan{ID: id, Group: s, Replica: r, Node: node, Loss: s == sg.loss, Recompute: s < len(rec) && rec[s]}
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
			sh := progShape{sched: sched, micros: micros[id], depth: nodeDepth(s),
				execOf: execOf, replicas: execs[s], chained: p.ChainedSums}
			if sched == Interleaved {
				P := sg.part.chunkNodes()
				order, err := InterleavedOrder(P, v, s%P, M)
				if err != nil {
					return nil, err
				}
				for _, ps := range order {
					if ps.Chunk == s/P {
						sh.passes = append(sh.passes, ps)
					}
				}
			}
			st.Program = program(&st, sh, pos)
			p.Stages = append(p.Stages, st)
		}
	}
	addTies(p, g, execs)
	return p, nil
}

// addTies writes the exchange of tied parameters' gradients between the
// stages that hold copies, before each executor's optimizer step: replica
// 0 of a stage sends its copies' gradients (summed over its replicas by
// then) to every executor of each other stage that shares a tied tensor
// with it, and every executor receives from replica 0 of each such stage.
// execs lists each stage's executors.
func addTies(p *Plan, g *nn.Graph, execs [][]int) {
	stageOf := map[string]int{}
	for _, st := range p.Stages {
		for _, l := range st.Layers {
			stageOf[l] = st.Group
		}
	}
	tied := map[string]bool{}
	for _, grp := range nn.Ties(g.Params()) {
		tied[grp[0].Name] = true
	}
	// holders[name]: the stages holding a copy of tied tensor name;
	// layers[s][name]: stage s's layers holding one, in node order.
	holders := map[string][]int{}
	layers := make([]map[string][]string, len(execs))
	for _, n := range g.Nodes {
		for _, prm := range n.Layer.Params() {
			if !tied[prm.Name] || !prm.Trainable() {
				continue
			}
			s := stageOf[n.Name]
			if !slices.Contains(holders[prm.Name], s) {
				holders[prm.Name] = append(holders[prm.Name], s)
			}
			if layers[s] == nil {
				layers[s] = map[string][]string{}
			}
			layers[s][prm.Name] = append(layers[s][prm.Name], n.Name)
		}
	}
	// carried[s][t]: stage s's layers whose copies go to stage t.
	carried := make([]map[int][]string, len(execs))
	for name, hs := range holders {
		for _, s := range hs {
			for _, t := range hs {
				if s == t {
					continue
				}
				if carried[s] == nil {
					carried[s] = map[int][]string{}
				}
				for _, l := range layers[s][name] {
					if !slices.Contains(carried[s][t], l) {
						carried[s][t] = append(carried[s][t], l)
					}
				}
			}
		}
	}
	pos := map[string]int{}
	for i, n := range g.Nodes {
		pos[n.Name] = i
	}
	for e := range p.Stages {
		st := &p.Stages[e]
		s := st.Group
		peers := slices.Sorted(maps.Keys(carried[s]))
		var tail []Instr
		if st.Replica == 0 {
			for _, t := range peers {
				ls := slices.SortedFunc(slices.Values(carried[s][t]), func(a, b string) int { return pos[a] - pos[b] })
				for _, q := range execs[t] {
					tail = append(tail, Instr{Op: OpSendTie, Peer: q, Tensors: ls})
				}
			}
		}
		for _, t := range peers {
			ls := slices.SortedFunc(slices.Values(carried[t][s]), func(a, b string) int { return pos[a] - pos[b] })
			tail = append(tail, Instr{Op: OpRecvTie, Peer: execs[t][0], Tensors: ls})
		}
		if len(tail) > 0 {
			n := len(st.Program) - 1 // OpStep
			st.Program = append(st.Program[:n:n], append(tail, st.Program[n])...)
		}
	}
}

// assignMicros gives each of M micro-batches (M the sum of split) to a
// replica, split[r] to replica r. With chained sums replica r takes the
// r-th block of consecutive micro-batches: it continues the sum of all
// micro-batches before its block, as one process does. Otherwise each
// next micro-batch goes to the replica furthest behind its share (ties
// to the earlier), which interleaves them: replicas fed by one executor,
// micro-batch after micro-batch, then work at the same time.
func assignMicros(split []int, chained bool) []int {
	var out []int
	if chained {
		for r, n := range split {
			for ; n > 0; n-- {
				out = append(out, r)
			}
		}
		return out
	}
	got := make([]int, len(split))
	M := 0
	for _, n := range split {
		M += n
	}
	for m := 0; m < M; m++ {
		best := -1
		for r, n := range split {
			// (got+1)/n < (got_best+1)/n_best, in integers.
			if got[r] < n && (best < 0 || (got[r]+1)*split[best] < (got[best]+1)*n) {
				best = r
			}
		}
		got[best]++
		out = append(out, best)
	}
	return out
}

// progShape is what an executor's program depends on besides its stage:
// the schedule, its micro-batches (ascending), its stage's depth (the
// longest path to a sink, in nodes), which executor runs each
// micro-batch of each stage, the executors of its own stage, and the
// order of the gradient sums.
type progShape struct {
	sched    Schedule
	micros   []int
	depth    int
	execOf   [][]int
	replicas []int
	chained  bool
	// passes are, under the interleaved schedule, the stage's passes in
	// its node's order (InterleavedOrder).
	passes []Pass
}

// program writes executor st's instruction list. The tensors of one
// message are listed in the model's node order (pos), on both ends.
func program(st *StagePlan, sh progShape, pos map[string]int) []Instr {
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
	// exec is the executor of stage q that runs micro-batch m.
	exec := func(q, m int) int {
		if q == Coordinator {
			return Coordinator
		}
		return sh.execOf[q][m]
	}
	R, r := len(sh.replicas), st.Replica
	var prog []Instr
	fwd := func(m int) {
		for _, q := range inPeers {
			prog = append(prog, Instr{Op: OpRecvAct, Micro: m, Peer: exec(q, m), Tensors: inputsFrom(q, false)})
		}
		prog = append(prog, Instr{Op: OpForward, Micro: m})
		if st.Loss {
			prog = append(prog, Instr{Op: OpLoss, Micro: m})
		}
		for _, q := range outPeers {
			prog = append(prog, Instr{Op: OpSendAct, Micro: m, Peer: exec(q, m), Tensors: outputsTo(q, false)})
		}
	}
	bwdOp := OpBackward
	if sh.sched == ZeroBubble {
		bwdOp = OpBackwardInput
	}
	bwd := func(m int) {
		if st.Recompute {
			// Before the gradients arrive: the pass overlaps their transfer.
			prog = append(prog, Instr{Op: OpRecompute, Micro: m})
		}
		for _, q := range gradIn {
			prog = append(prog, Instr{Op: OpRecvGrad, Micro: m, Peer: exec(q, m), Tensors: outputsTo(q, true)})
		}
		if sh.chained && r > 0 && m == sh.micros[0] {
			// The gradients start from the sum of the replicas before.
			prog = append(prog, Instr{Op: OpRecvSum, Peer: sh.replicas[r-1]})
		}
		prog = append(prog, Instr{Op: bwdOp, Micro: m})
		for _, q := range gradOut {
			prog = append(prog, Instr{Op: OpSendGrad, Micro: m, Peer: exec(q, m), Tensors: inputsFrom(q, true)})
		}
	}
	// The stage's program over all M micro-batches, restricted to this
	// executor's: any run of the stages without replicas then orders the
	// replicas' instructions too, so they cannot deadlock where it does not.
	M := len(sh.execOf[st.Group])
	own := make([]bool, M)
	for _, m := range sh.micros {
		own[m] = true
	}
	pass := func(m int, f func(int)) {
		if own[m] {
			f(m)
		}
	}
	switch sh.sched {
	case ZeroBubble:
		// 1F1B's forward and backward order; stage k runs the weight pass
		// of micro-batch m after the backward pass of m+k, and the last k
		// at the end. Input gradients travel upstream a weight pass
		// sooner, and the later stages, which drain first, fill their
		// drain with the weight passes they held back (ZB-H1).
		w, lag := min(sh.depth-1, M), st.Group
		nw := 0 // weight passes written
		for m := 0; m < w; m++ {
			fwd(m)
		}
		back := func(m int) {
			bwd(m)
			for ; nw <= m-lag; nw++ {
				prog = append(prog, Instr{Op: OpWeight, Micro: nw})
			}
		}
		for m := 0; m+w < M; m++ {
			fwd(m + w)
			back(m)
		}
		for m := M - w; m < M; m++ {
			back(m)
		}
		for ; nw < M; nw++ {
			prog = append(prog, Instr{Op: OpWeight, Micro: nw})
		}
	case Interleaved:
		for _, ps := range sh.passes {
			if ps.Backward {
				bwd(ps.Micro)
			} else {
				fwd(ps.Micro)
			}
		}
	case GPipe:
		for m := 0; m < M; m++ {
			pass(m, fwd)
		}
		for m := 0; m < M; m++ {
			pass(m, bwd)
		}
	default:
		w := min(sh.depth-1, M)
		for m := 0; m < w; m++ {
			pass(m, fwd)
		}
		for m := 0; m+w < M; m++ {
			pass(m+w, fwd)
			pass(m, bwd)
		}
		for m := M - w; m < M; m++ {
			pass(m, bwd)
		}
	}
	if R > 1 {
		if !sh.chained && r > 0 {
			prog = append(prog, Instr{Op: OpRecvSum, Peer: sh.replicas[r-1]})
		}
		if r < R-1 {
			prog = append(prog, Instr{Op: OpSendSum, Peer: sh.replicas[r+1]}, Instr{Op: OpRecvSum, Peer: sh.replicas[R-1]})
		} else {
			for _, q := range sh.replicas[:R-1] {
				prog = append(prog, Instr{Op: OpSendSum, Peer: q})
			}
		}
	}
	return append(prog, Instr{Op: OpStep})
}

// Validate checks a plan against the model: its partition (Partition.
// Validate), that every stage's inputs, outputs and gradient orders are
// what Build derives, and that every program runs each micro-batch's
// forward and backward pass once, backward passes in ascending order, the
// optimizer step last, with every send matched by a receive, and that the
// programs do not deadlock. Of a stage with replicas, it checks that the
// replicas are adjacent and in order, run the same layers on the
// micro-batches Build gives them (each micro-batch once), exchange each
// micro-batch with the executor that runs it in the next or previous
// stage, and sum their gradients in the chain that Build writes. A plan
// read from the network or disk must pass it before it runs.
func (p *Plan) Validate(g *nn.Graph) error {
	if p.Format != 1 {
		return fmt.Errorf("%w: format %d (want 1)", ErrPlan, p.Format)
	}
	if p.Graph != GraphHash(g) {
		return fmt.Errorf("%w: plan is for graph %s, model is %s", ErrPlan, p.Graph, GraphHash(g))
	}
	if (p.Schedule == Interleaved) != (p.Chunks > 1) || p.Chunks < 0 {
		return fmt.Errorf("%w: %d chunks per node under the %s schedule (interleaved has 2 or more, the others none)", ErrPlan, p.Chunks, p.Schedule)
	}
	var nodes []string
	for i, s := range p.Stages {
		if s.ID != i {
			return fmt.Errorf("%w: stage %d has id %d", ErrPlan, i, s.ID)
		}
		prev := StagePlan{Group: -1}
		if i > 0 {
			prev = p.Stages[i-1]
		}
		if s.Replica == 0 && s.Group != prev.Group+1 || s.Replica != 0 && (s.Replica != prev.Replica+1 || s.Group != prev.Group) {
			return fmt.Errorf("%w: stage %d is replica %d of stage %d after replica %d of stage %d (replicas of a stage are adjacent, in order)",
				ErrPlan, i, s.Replica, s.Group, prev.Replica, prev.Group)
		}
		nodes = append(nodes, s.Node)
	}
	var rec []bool // per stage of the partition
	for _, s := range p.Stages {
		if s.Replica == 0 {
			rec = append(rec, s.Recompute)
		} else if s.Recompute != rec[s.Group] {
			return fmt.Errorf("%w: stage %d recomputes its activations and replica 0 of its stage does not, or the other way round", ErrPlan, s.ID)
		}
	}
	want, err := buildRecompute(g, p.Partition(), nodes, p.Schedule, p.MicroBatches, p.MicroBatchSize, p.ChainedSums, rec)
	if err != nil {
		return err
	}
	if want.ChainedSums != p.ChainedSums {
		return fmt.Errorf("%w: the plan orders gradient sums but has no replicas", ErrPlan)
	}
	runner := map[[2]int]int{} // {stage, micro-batch} -> executor
	for e, st := range want.Stages {
		for _, m := range st.Micros() {
			runner[[2]int{st.Group, m}] = e
		}
	}
	runs := func(e, m int) bool {
		r, ok := runner[[2]int{want.Stages[e].Group, m}]
		return ok && r == e
	}
	for i := range p.Stages {
		a, b := p.Stages[i], want.Stages[i]
		if !slices.Equal(a.Layers, b.Layers) {
			return fmt.Errorf("%w: stage %d lists its layers out of topological order or differs from replica 0", ErrPlan, i)
		}
		if a.Loss != b.Loss || !slices.Equal(a.Inputs, b.Inputs) || !slices.EqualFunc(a.Outputs, b.Outputs, func(x, y StageOutput) bool {
			return x.Name == y.Name && x.Grad == y.Grad && slices.Equal(x.To, y.To)
		}) {
			return fmt.Errorf("%w: stage %d's inputs, outputs or loss flag differ from its layers' boundary", ErrPlan, i)
		}
		if err := checkProgram(p, &want.Stages[i], runs); err != nil {
			return err
		}
		if p.Schedule == Interleaved && !slices.EqualFunc(a.Program, b.Program, func(x, y Instr) bool {
			return x.Op == y.Op && x.Micro == y.Micro && x.Peer == y.Peer && slices.Equal(x.Tensors, y.Tensors)
		}) {
			return fmt.Errorf("%w: stage %d's program is not its chunk's share of its node's interleaved 1F1B order", ErrPlan, i)
		}
	}
	// Matched transfers and no deadlock: replay with unit costs.
	if _, err := replay(p, unitCosts{}); err != nil {
		return err
	}
	return nil
}

// checkProgram checks one executor's program for the invariants the
// runtime relies on; want is the executor as Build writes it, and
// runs(e, m) reports whether executor e runs micro-batch m.
func checkProgram(p *Plan, want *StagePlan, runs func(e, m int) bool) error {
	st := &p.Stages[want.ID]
	M := p.MicroBatches
	micros := want.Micros()
	mine := make([]bool, M)
	for _, m := range micros {
		mine[m] = true
	}
	fwd := make([]int, M)
	last := Instr{Op: OpStep} // the last forward or recompute pass
	nextB, nextW := 0, 0      // indices into micros
	zb := p.Schedule == ZeroBubble
	firstB, lastB := -1, -1
	for k, in := range st.Program {
		if in.Op.perMicro() && (in.Micro < 0 || in.Micro >= M) {
			return fmt.Errorf("%w: stage %d instruction %d (%v): micro-batch out of range", ErrPlan, st.ID, k, in)
		}
		if in.Op.transfer() && in.Peer != Coordinator {
			if in.Peer < 0 || in.Peer >= len(p.Stages) {
				return fmt.Errorf("%w: stage %d instruction %d (%v): no stage %d", ErrPlan, st.ID, k, in, in.Peer)
			}
			if !runs(in.Peer, in.Micro) {
				return fmt.Errorf("%w: stage %d instruction %d (%v): stage %d does not run micro-batch %d", ErrPlan, st.ID, k, in, in.Peer, in.Micro)
			}
		}
		if in.Op.sum() && len(in.Tensors) > 0 {
			return fmt.Errorf("%w: stage %d instruction %d (%v) names tensors (a sum carries all the stage's parameters)", ErrPlan, st.ID, k, in)
		}
		switch in.Op {
		case OpForward:
			if !mine[in.Micro] {
				return fmt.Errorf("%w: stage %d runs forward %d outside its micro-batches", ErrPlan, st.ID, in.Micro)
			}
			fwd[in.Micro]++
			last = in
		case OpRecompute:
			if !st.Recompute {
				return fmt.Errorf("%w: stage %d recomputes micro-batch %d but keeps its activations", ErrPlan, st.ID, in.Micro)
			}
			if fwd[in.Micro] != 1 {
				return fmt.Errorf("%w: stage %d recomputes micro-batch %d before its forward pass", ErrPlan, st.ID, in.Micro)
			}
			last = in
		case OpWeight:
			if !zb || nextW >= len(micros) || in.Micro != micros[nextW] || nextW >= nextB {
				return fmt.Errorf("%w: stage %d runs weight pass %d out of turn (after its backward pass, in ascending order, under zb only)", ErrPlan, st.ID, in.Micro)
			}
			nextW++
		case OpBackward, OpBackwardInput:
			if (in.Op == OpBackwardInput) != zb {
				return fmt.Errorf("%w: stage %d runs %v under the %s schedule", ErrPlan, st.ID, in, p.Schedule)
			}
			if st.Recompute && (last.Op != OpRecompute || last.Micro != in.Micro) {
				return fmt.Errorf("%w: stage %d runs backward %d, and its last pass was not the recomputation of micro-batch %d", ErrPlan, st.ID, in.Micro, in.Micro)
			}
			last = in
			if nextB >= len(micros) || in.Micro != micros[nextB] {
				return fmt.Errorf("%w: stage %d runs backward %d out of turn (backward passes must be in ascending order)", ErrPlan, st.ID, in.Micro)
			}
			if fwd[in.Micro] != 1 {
				return fmt.Errorf("%w: stage %d runs backward %d before its forward", ErrPlan, st.ID, in.Micro)
			}
			nextB++
			if firstB < 0 {
				firstB = k
			}
			lastB = k
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
	for _, m := range micros {
		if fwd[m] != 1 {
			return fmt.Errorf("%w: stage %d runs forward %d %d times", ErrPlan, st.ID, m, fwd[m])
		}
	}
	if zb && nextW != len(micros) {
		return fmt.Errorf("%w: stage %d does not run every weight pass", ErrPlan, st.ID)
	}
	if nextB != len(micros) || len(st.Program) == 0 || st.Program[len(st.Program)-1].Op != OpStep {
		return fmt.Errorf("%w: stage %d does not run every backward pass and then the optimizer step", ErrPlan, st.ID)
	}
	if got, exp := sumChain(st.Program, firstB, lastB), sumChain(want.Program, -1, -1); !slices.Equal(got, exp) {
		return fmt.Errorf("%w: stage %d sums its gradients as %v, want %v", ErrPlan, st.ID, got, exp)
	}
	if got, exp := tieTail(st.Program), tieTail(want.Program); !slices.EqualFunc(got, exp, func(x, y Instr) bool {
		return x.Op == y.Op && x.Peer == y.Peer && slices.Equal(x.Tensors, y.Tensors)
	}) {
		return fmt.Errorf("%w: stage %d exchanges tied gradients as %v before its step, want %v", ErrPlan, st.ID, got, exp)
	}
	return nil
}

// tieTail returns the tie instructions of a program if they come all
// together just before its final step (else also those, which then differ
// from Build's).
func tieTail(prog []Instr) []Instr {
	var out []Instr
	k := len(prog) - 1
	for k > 0 && prog[k-1].Op.tie() {
		k--
	}
	for j, in := range prog {
		if in.Op.tie() && j < k {
			out = append(out, Instr{Op: in.Op, Peer: -3}) // out of place
		}
	}
	return append(out, prog[k:max(k, len(prog)-1)]...)
}

// sumChain lists a program's gradient sums as "op peer", each marked
// "before" or "after" when it comes before the first backward pass
// (instruction firstB) or after the last (lastB), and "among" otherwise;
// firstB < 0 finds them.
func sumChain(prog []Instr, firstB, lastB int) []string {
	if firstB < 0 {
		for k, in := range prog {
			if in.Op == OpBackward {
				lastB = k
				if firstB < 0 {
					firstB = k
				}
			}
		}
	}
	var out []string
	for k, in := range prog {
		if !in.Op.sum() {
			continue
		}
		where := "among"
		if k < firstB {
			where = "before"
		} else if k > lastB {
			where = "after"
		}
		out = append(out, fmt.Sprintf("%s %d %s the backward passes", in.Op, in.Peer, where))
	}
	return out
}

// Sequential reports whether the plan's stages form a chain, each stage
// feeding the next (a tensor may also skip ahead): a sequential pipeline,
// as opposed to a DAG of stages of which some run side by side.
func (p *Plan) Sequential() bool {
	for _, st := range p.Stages {
		k := st.Group
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

// Tied is a tensor read by layers on several stages (tied weights, nn.Ties):
// its copies' gradients are exchanged before every step.
type Tied struct {
	Name string
	// Stages are the stages of the partition that hold a copy, ascending.
	Stages []int
	Bytes  int
}

// String is "name on s0, s2".
func (t Tied) String() string {
	on := make([]string, len(t.Stages))
	for i, s := range t.Stages {
		on[i] = fmt.Sprintf("s%d", s)
	}
	return t.Name + " on " + strings.Join(on, ", ")
}

// TiedAcross lists the tied tensors of g whose copies p puts on more than
// one stage, in the order of their first copy.
func (p *Plan) TiedAcross(g *nn.Graph) []Tied {
	stageOf := map[string]int{}
	for _, st := range p.Stages {
		for _, l := range st.Layers {
			stageOf[l] = st.Group
		}
	}
	at := map[*nn.Param]int{}
	for _, n := range g.Nodes {
		for _, prm := range n.Layer.Params() {
			at[prm] = stageOf[n.Name]
		}
	}
	var out []Tied
	for _, grp := range nn.Ties(g.Params()) {
		var stages []int
		for _, prm := range grp {
			if s := at[prm]; !slices.Contains(stages, s) {
				stages = append(stages, s)
			}
		}
		if len(stages) > 1 {
			slices.Sort(stages)
			out = append(out, Tied{Name: grp[0].Name, Stages: stages, Bytes: 4 * nn.Size(grp[0].Value.Shape())})
		}
	}
	return out
}
