package actors

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"runtime"
	"runtime/debug"
	"slices"
	"sync"
	"time"

	"github.com/ppnode/ppnode/balance"
	"github.com/ppnode/ppnode/dataplane"
	"github.com/ppnode/ppnode/job"
	"github.com/ppnode/ppnode/job/core"
	"github.com/ppnode/ppnode/nn"
)

// StageSpec is everything a stage actor needs to run its part of a plan:
// the job's recipe, what the data feeds the model (so that a node needs no
// data set), and its StagePlan.
type StageSpec struct {
	Job        job.Checked       `json:"job"` // checked as it is decoded
	Generation uint64            `json:"generation"`
	Data       job.Sample        `json:"data"`
	Graph      string            `json:"graph"` // balance.GraphHash of the model
	Plan       balance.StagePlan `json:"plan"`
	// IOTimeout bounds every data-plane read and write (default 10 min).
	IOTimeout time.Duration `json:"io_timeout,omitempty"`
	// Sources, when the job moves to this plan from a running one, say
	// where the state of the stage's layers comes from (see
	// ReceiveState); empty when the stage starts from the seed or a cut.
	Sources []core.StateSource `json:"sources,omitempty"`
	// Rates are the speeds (bytes/s) of the stage's links by peer stage
	// (balance.Coordinator: the coordinator), for their codecs.
	Rates map[int]float64 `json:"rates,omitempty"`
	// Groups is, for a plan with replicas, the stage of the partition
	// that each executor of the plan runs (balance.StagePlan.Group):
	// instructions name executors, StageOutput.To names groups.
	Groups []int `json:"groups,omitempty"`
	// Turn is, for a stage that shares its node with other stages of the
	// plan (the chunks of an interleaved plan), the node's order of their
	// instructions (balance.Plan.NodeOrder): the stages take turns in it.
	Turn []balance.Slot `json:"turn,omitempty"`
}

// labelsTensor is the tensor id of a micro-batch's labels on the link from
// the coordinator; other tensors are identified by tensorID.
const labelsTensor = math.MaxUint32

// tensorID numbers a tensor of the graph the same way on every node: a
// layer's output by its index in g.Nodes, a graph input after them.
func tensorID(g *nn.Graph, name string) (uint32, bool) {
	for i, n := range g.Nodes {
		if n.Name == name {
			return uint32(i), true
		}
	}
	if i := slices.Index(g.InputNames, name); i >= 0 {
		return uint32(len(g.Nodes) + i), true
	}
	return 0, false
}

// linkID names the link on which stage from sends to stage to (from =
// balance.Coordinator for the coordinator's link); both ends compute it.
func linkID(from, to int) uint32 { return uint32(from+1)<<16 | uint32(to) }

// stageEngine runs one stage's program, step after step. It is driven by
// one goroutine at a time (the stage actor hands it on); the links' reader
// and sender goroutines only touch the inbox and the send queues.
type stageEngine struct {
	spec   StageSpec
	job    job.Spec // spec.Job's
	g      *nn.Graph
	st     *nn.Stage
	be     nn.Backend
	opt    nn.Optimizer
	params []*nn.Param
	M      int
	id     map[string]uint32

	inIdx, outIdx map[string]int

	ins      [][]*nn.Tensor   // [m][input]
	outs     [][]*nn.Tensor   // [m][output]
	gin      [][]*nn.Tensor   // [m][input]: input gradients of the last backward
	grads    [][][]*nn.Tensor // [m][output][position in To]
	acc      [][]*nn.Tensor   // [m][output]: owned buffer for a sum of gradients
	dout     []*nn.Tensor
	loss     []nn.Loss
	lossGrad []*nn.Tensor
	zeros    map[string]*nn.Tensor

	// slot is the nn.Stage slot of each micro-batch: a slot is taken at a
	// forward pass and freed by the backward pass, so a stage keeps only as
	// many micro-batches' activations as its schedule has in flight (1F1B:
	// S-k on stage k; GPipe: M). reused marks the micro-batches whose slot
	// served an earlier one in the same step.
	slot   []int
	reused []bool

	box   *inbox
	peers map[int]*peer

	// pending is the optimizer update of the last step. It is applied
	// when the next step begins or the state is read (settle): a step
	// that fails anywhere in the pipeline is then dropped everywhere, and
	// every stage still holds the state before it.
	pending *pendingUpdate
	// gradStep is the step whose gradients the parameters hold (-1: none).
	gradStep int
	// lastReplica is the executor that sends the replicas' total (-1
	// without replicas); sumSent the replicas this step's sums were
	// queued for: the gradients must not change until they are written.
	lastReplica int
	sumSent     []int
	// ties are the model's tied parameters (nn.Ties) with a copy on this
	// stage, local those copies, tiedIn the copies of each layer that a tie
	// instruction names, tieGrad the other stages' copies' gradients
	// received this step (tieGrads, per group of ties, their slots for
	// nn.SumTies), tieSent the executors this step's tied gradients were
	// queued for.
	ties     [][]*nn.Param
	local    map[*nn.Param]bool
	tiedIn   map[string][]*nn.Param
	tieGrad  map[*nn.Param]*nn.Tensor
	tieGrads [][]*nn.Tensor
	tieSent  []int
	// turn, if set, is the executor of the node this stage shares with
	// other stages of the plan: each instruction waits for its turn.
	turn *turn
	// clip says the job clips its gradients' norm: a step reports the
	// sums of squares of the gradients of normed (its trainable
	// parameters, a tied tensor's copies once), named normNames, and its
	// update waits for the scale.
	clip      bool
	normed    []*nn.Param
	normNames []string
}

type pendingUpdate struct {
	step int
	lr   float64
	// scale is the gradients' factor from gradient clipping (ClipGrads;
	// 0 until the coordinator sends it).
	scale float32
}

func newStageEngine(spec StageSpec, threads int) (*stageEngine, error) {
	js := spec.Job.Spec()
	g, err := js.BuildModel(spec.Data)
	if err != nil {
		return nil, err
	}
	if h := balance.GraphHash(g); h != spec.Graph {
		return nil, fmt.Errorf("model %s here hashes to %s, the plan's to %s (different ppnode versions?)", js.Model, h, spec.Graph)
	}
	p := spec.Plan
	st, err := g.Stage(p.Layers)
	if err != nil {
		return nil, err
	}
	replicated := slices.ContainsFunc(p.Program, func(in balance.Instr) bool { return in.Op == balance.OpRecvSum || in.Op == balance.OpSendSum })
	if replicated && slices.ContainsFunc(st.Params(), func(prm *nn.Param) bool { return prm.Running }) {
		return nil, fmt.Errorf("stage %d: a stage with running statistics (BatchNorm) cannot have replicas: each would see other micro-batches", p.ID)
	}
	for _, in := range p.Program {
		if spec.Groups != nil && in.Peer != balance.Coordinator && (in.Peer < 0 || in.Peer >= len(spec.Groups)) {
			return nil, fmt.Errorf("stage %d: instruction %v names no stage of the plan", p.ID, in)
		}
	}
	if replicated && spec.Groups == nil {
		return nil, fmt.Errorf("stage %d: a replica's spec lacks the plan's groups", p.ID)
	}
	if len(st.Inputs) != len(p.Inputs) || len(st.Outputs) != len(p.Outputs) {
		return nil, fmt.Errorf("stage %d: plan has %d inputs and %d outputs, the model %d and %d", p.ID, len(p.Inputs), len(p.Outputs), len(st.Inputs), len(st.Outputs))
	}
	for k, in := range p.Inputs {
		if st.Inputs[k] != in.Name {
			return nil, fmt.Errorf("stage %d: input %d is %q in the plan, %q in the model", p.ID, k, in.Name, st.Inputs[k])
		}
	}
	for k, o := range p.Outputs {
		if st.Outputs[k] != o.Name {
			return nil, fmt.Errorf("stage %d: output %d is %q in the plan, %q in the model", p.ID, k, o.Name, st.Outputs[k])
		}
	}
	if err := checkSources(p, spec.Sources); err != nil {
		return nil, err
	}
	e := &stageEngine{spec: spec, job: js, g: g, st: st, params: st.Params(), id: map[string]uint32{},
		inIdx: map[string]int{}, outIdx: map[string]int{}, zeros: map[string]*nn.Tensor{},
		box: newInbox(), peers: map[int]*peer{}, gradStep: -1, lastReplica: -1}
	if replicated {
		for i, grp := range spec.Groups {
			if grp == spec.Groups[p.ID] {
				e.lastReplica = i
			}
		}
	}
	for _, prm := range e.params {
		prm.Reset(js.Seed)
	}
	if err := e.setTies(); err != nil {
		return nil, err
	}
	for k, n := range st.Inputs {
		e.inIdx[n] = k
	}
	for k, n := range st.Outputs {
		e.outIdx[n] = k
	}
	for _, n := range append(slices.Clone(st.Inputs), st.Outputs...) {
		id, ok := tensorID(g, n)
		if !ok {
			return nil, fmt.Errorf("stage %d: tensor %q is not in the model", p.ID, n)
		}
		e.id[n] = id
	}
	e.M = js.MicroBatches
	for _, in := range p.Program {
		if in.Micro < 0 || in.Micro >= e.M {
			return nil, fmt.Errorf("stage %d: program names micro-batch %d, the job has %d", p.ID, in.Micro, e.M)
		}
	}
	e.slot, e.reused = assignSlots(p.Program, e.M)
	if p.Recompute {
		e.slot, e.reused = sharedSlot(e.M)
	}
	if e.clip = js.ClipGradNorm > 0; e.clip {
		e.normed = nn.Normed(e.params)
		for _, p := range e.normed {
			e.normNames = append(e.normNames, p.Name)
		}
	}
	if e.be, err = js.NewBackend(threads); err != nil {
		return nil, err
	}
	if e.opt, err = js.NewOptimizer(e.be.Threads()); err != nil {
		return nil, err
	}
	M := e.M
	e.ins, e.outs, e.gin = make([][]*nn.Tensor, M), make([][]*nn.Tensor, M), make([][]*nn.Tensor, M)
	e.grads, e.acc = make([][][]*nn.Tensor, M), make([][]*nn.Tensor, M)
	e.loss, e.lossGrad = make([]nn.Loss, M), make([]*nn.Tensor, M)
	for m := range e.loss {
		e.loss[m] = js.NewLoss(spec.Data, e.be.Threads())
	}
	for m := range M {
		e.ins[m] = make([]*nn.Tensor, len(st.Inputs))
		e.grads[m] = make([][]*nn.Tensor, len(st.Outputs))
		e.acc[m] = make([]*nn.Tensor, len(st.Outputs))
		for k, o := range p.Outputs {
			e.grads[m][k] = make([]*nn.Tensor, len(o.To))
		}
	}
	e.dout = make([]*nn.Tensor, len(st.Outputs))
	return e, nil
}

// assignSlots gives each micro-batch the lowest slot free at its forward
// pass; a backward pass (under zb its weight pass) frees its micro-batch's slot.
func assignSlots(prog []balance.Instr, M int) (slot []int, reused []bool) {
	slot, reused = make([]int, M), make([]bool, M)
	var free []int // free slots, ascending
	next := 0
	for _, in := range prog {
		switch in.Op {
		case balance.OpForward:
			if len(free) > 0 {
				slot[in.Micro], free = free[0], free[1:]
				reused[in.Micro] = true
			} else {
				slot[in.Micro] = next
				next++
			}
		case balance.OpBackward, balance.OpWeight: // a weight pass reads the slot
			i, _ := slices.BinarySearch(free, slot[in.Micro])
			free = slices.Insert(free, i, slot[in.Micro])
		}
	}
	return slot, reused
}

// sharedSlot puts every micro-batch in slot 0, as a stage that recomputes
// its activations keeps one micro-batch's: each pass into it waits until
// what the slot's earlier passes sent has left.
func sharedSlot(M int) (slot []int, reused []bool) {
	slot, reused = make([]int, M), make([]bool, M)
	for m := range reused {
		reused[m] = true
	}
	return slot, reused
}

// incoming lists the stages that dial this one (balance.Coordinator
// first: every stage has a link from the coordinator): those it receives
// activations from, and the replicas and tie holders before it that it
// sums with.
func (e *stageEngine) incoming() []int {
	from := []int{balance.Coordinator}
	for _, in := range e.spec.Plan.Program {
		if (in.Op == balance.OpRecvAct || e.sumWith(in, false)) && in.Peer != balance.Coordinator && !slices.Contains(from, in.Peer) {
			from = append(from, in.Peer)
		}
	}
	return from
}

// outgoing lists the stages this one dials: those it sends activations
// to, and the replicas and tie holders after it that it sums with.
func (e *stageEngine) outgoing() []int {
	var to []int
	for _, in := range e.spec.Plan.Program {
		if (in.Op == balance.OpSendAct || e.sumWith(in, true)) && !slices.Contains(to, in.Peer) {
			to = append(to, in.Peer)
		}
	}
	return to
}

// sumWith reports whether in exchanges sums with a replica, or tied
// gradients with a stage, after this executor (after), or before it: the
// one before dials the link.
func (e *stageEngine) sumWith(in balance.Instr, after bool) bool {
	switch in.Op {
	case balance.OpRecvSum, balance.OpSendSum, balance.OpRecvTie, balance.OpSendTie:
		return (in.Peer > e.spec.Plan.ID) == after
	}
	return false
}

// setTies finds the tied parameters with a copy on this stage and the
// copies in each layer that the program's tie instructions name (layers of
// the model: checked).
func (e *stageEngine) setTies() error {
	e.local, e.tieGrad, e.tiedIn = map[*nn.Param]bool{}, map[*nn.Param]*nn.Tensor{}, map[string][]*nn.Param{}
	for _, prm := range e.params {
		e.local[prm] = true
	}
	tied := map[*nn.Param]bool{}
	for _, grp := range nn.Ties(e.g.Params()) {
		if slices.ContainsFunc(grp, func(p *nn.Param) bool { return e.local[p] }) {
			e.ties = append(e.ties, grp)
			e.tieGrads = append(e.tieGrads, make([]*nn.Tensor, len(grp)))
			for _, p := range grp {
				tied[p] = true
			}
		}
	}
	for _, in := range e.spec.Plan.Program {
		if in.Op != balance.OpSendTie && in.Op != balance.OpRecvTie {
			continue
		}
		for _, l := range in.Tensors {
			n := e.g.Node(l)
			if n == nil {
				return fmt.Errorf("stage %d: instruction %v names no layer of the model", e.spec.Plan.ID, in)
			}
			e.tiedIn[l] = slices.DeleteFunc(slices.Clone(n.Layer.Params()), func(p *nn.Param) bool { return !tied[p] })
		}
	}
	return nil
}

// recvTie receives the gradients of the tied copies in the layers that
// in names, from the stage that holds them.
func (e *stageEngine) recvTie(in balance.Instr) error {
	k := 0
	for _, l := range in.Tensors {
		for _, prm := range e.tiedIn[l] {
			t, err := e.box.wait(boxKey{int32(in.Peer), dataplane.KindSum, 0, uint32(k)})
			if err != nil {
				return err
			}
			if !nn.SameShape(t.Shape(), prm.Value.Shape()) {
				return fmt.Errorf("stage %d: tied gradient of %q in layer %s from stage %d has shape %v, want %v",
					e.spec.Plan.ID, prm.Name, l, in.Peer, t.Shape(), prm.Value.Shape())
			}
			e.tieGrad[prm] = t
			k++
		}
	}
	return nil
}

// sumTies gives every local copy of a tied tensor the sum of all copies'
// gradients, in the model's node order (nn.SumTies), as one process adds
// them.
func (e *stageEngine) sumTies() error {
	if len(e.ties) == 0 {
		return nil
	}
	// The gradients are about to change: what was queued of them (tied
	// gradients, a replica's sum) must leave first.
	for _, sent := range [2][]int{e.tieSent, e.sumSent} {
		for _, q := range sent {
			if err := e.peers[q].flush(); err != nil {
				return err
			}
		}
	}
	e.tieSent, e.sumSent = e.tieSent[:0], e.sumSent[:0]
	for gi, grp := range e.ties {
		grads := e.tieGrads[gi]
		for i, prm := range grp {
			if e.local[prm] {
				continue
			}
			if grads[i] = e.tieGrad[prm]; grads[i] == nil {
				return fmt.Errorf("stage %d: no gradient of a copy of tied parameter %q from the stage that holds it", e.spec.Plan.ID, prm.Name)
			}
		}
		nn.SumTies(grp, grads)
	}
	clear(e.tieGrad)
	return nil
}

// group is the stage of the partition that executor k runs.
func (e *stageEngine) group(k int) int {
	if e.spec.Groups == nil || k < 0 {
		return k
	}
	return e.spec.Groups[k]
}

// attach starts the reader and sender goroutines of an established link;
// broken, if set, is called (from the reader) when the link fails.
func (e *stageEngine) attach(peerStage int, lk dataplane.Link, broken func(error)) {
	e.peers[peerStage] = newPeer(peerStage, lk, e.box, broken)
}

// abort makes the running step's waits, for tensors and for the node's
// turn, return err.
func (e *stageEngine) abort(err error) {
	e.box.fail(err)
	if e.turn != nil {
		e.turn.fail(err)
	}
}

// close closes every link and waits for their goroutines.
func (e *stageEngine) close() {
	for _, p := range e.peers {
		p.close()
	}
	e.box.fail(dataplane.ErrClosed)
}

// stepResult is what a step reports.
type stepResult struct {
	forwardNs, backwardNs, updateNs, waitNs, wallNs int64
	// cpuNs is the CPU time the process used during the step (0: unknown).
	cpuNs            int64
	loss             float64
	correct, samples int64
	// gradNames and gradSumsq are, with clipping, each trainable
	// parameter's gradient's nn.SumSquares, by name.
	gradNames []string
	gradSumsq []float64
	// passes are the step's compute instructions as they ran, their
	// times from the step's start; they point into block, allocated once
	// a step for at most every instruction and the update.
	passes []*PassTiming
	block  []PassTiming
	start  time.Time
}

// pass records compute instruction op of micro-batch m, begun at t0, and
// returns its duration.
func (r *stepResult) pass(op balance.Op, m int, t0 time.Time) int64 {
	d := time.Since(t0)
	if n := len(r.block); n < cap(r.block) {
		r.block = r.block[:n+1]
		pt := &r.block[n]
		pt.Op, pt.Micro, pt.StartNs, pt.DurNs = int32(op), int32(m), int64(t0.Sub(r.start)), int64(d)
		r.passes = append(r.passes, pt)
	}
	return int64(d)
}

// step runs the program once: one training step with learning rate lr,
// its loss's gradient scaled by 1/mass (the mini-batch's nn.Loss Mass; 0:
// none, every label ignored). A panic inside the model (a malformed tensor
// from a peer) becomes an error; the stage is then unusable until it is
// set up again.
func (e *stageEngine) step(global int, lr, mass float64) (res stepResult, err error) {
	// The tensors this step received are done with before the next step's
	// arrive into the same buffers (inbox.buffer); that order comes through
	// the coordinator, over the network, so the inbox marks it too.
	defer e.box.stepDone()
	defer func() {
		if err != nil && e.turn != nil {
			e.turn.fail(err) // the node's other stages stop waiting for this one
		}
	}()
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("stage %d step %d: %v\n%s", e.spec.Plan.ID, global, r, debug.Stack())
		}
	}()
	if !(mass >= 0) || math.IsInf(mass, 0) { // a rate that diverges is the job's own: its loss says so
		return res, fmt.Errorf("stage %d step %d: loss mass %v: want a finite number from 0 up", e.spec.Plan.ID, global, mass)
	}
	var scale float32 // a step whose every label is ignored learns nothing
	if mass > 0 {
		scale = float32(1 / mass)
	}
	res.start = time.Now()
	cpu0 := processCPU()
	defer func() {
		res.wallNs = int64(time.Since(res.start))
		if cpu0 > 0 {
			res.cpuNs = int64(processCPU() - cpu0)
		}
	}()
	ctx := nn.Ctx{Backend: e.be, Train: true, Seed: e.job.Seed, Step: global}
	p := e.spec.Plan
	res.block = make([]PassTiming, 0, len(p.Program)+1)
	res.passes = make([]*PassTiming, 0, len(p.Program)+1)
	t0 := time.Now()
	if err := e.settle(global); err != nil {
		return res, err
	}
	res.updateNs += res.pass(balance.OpStep, 0, t0)
	e.gradStep, e.sumSent, e.tieSent = global, e.sumSent[:0], e.tieSent[:0]
	clear(e.tieGrad)
	backwards := 0
	for pc := 0; pc < len(p.Program); pc++ {
		if e.turn != nil {
			if pc > 0 {
				e.turn.done()
			}
			t0 := time.Now()
			err := e.turn.wait(p.ID, pc)
			res.waitNs += int64(time.Since(t0))
			if err != nil {
				return res, err
			}
		}
		in := p.Program[pc]
		m := in.Micro
		ctx.Micro = m
		switch in.Op {
		case balance.OpRecvAct:
			for _, name := range in.Tensors {
				t0 := time.Now()
				t, err := e.box.wait(boxKey{int32(in.Peer), actKind(in.Peer), uint32(m), e.id[name]})
				res.waitNs += int64(time.Since(t0))
				if err != nil {
					return res, err
				}
				e.ins[m][e.inIdx[name]] = t
			}
		case balance.OpForward:
			if e.reused[m] {
				// The slot's tensors of an earlier micro-batch may still
				// be queued for sending: a wait, not compute.
				t0 := time.Now()
				for _, pr := range e.peers {
					if err := pr.flush(); err != nil {
						return res, err
					}
				}
				res.waitNs += int64(time.Since(t0))
			}
			t0 := time.Now()
			e.outs[m] = e.st.Forward(&ctx, e.slot[m], e.ins[m])
			res.forwardNs += res.pass(in.Op, m, t0)
		case balance.OpBackwardInput:
			t0 := time.Now()
			e.backwardInput(&ctx, m)
			res.backwardNs += res.pass(in.Op, m, t0)
		case balance.OpWeight:
			t0 := time.Now()
			e.st.BackwardWeight(&ctx, e.slot[m])
			res.backwardNs += res.pass(in.Op, m, t0)
		case balance.OpRecompute:
			t0 := time.Now()
			if err := e.recompute(&ctx, m); err != nil {
				return res, err
			}
			res.forwardNs += res.pass(in.Op, m, t0)
		case balance.OpLoss:
			t0 := time.Now()
			y, err := e.box.wait(boxKey{int32(balance.Coordinator), dataplane.KindInput, uint32(m), labelsTensor})
			res.waitNs += int64(time.Since(t0))
			if err != nil {
				return res, err
			}
			t0 = time.Now()
			logits := e.outs[m][e.outIdx[e.g.Output]]
			labels := nn.F32(y) // the inbox keeps it until the step ends
			if err := e.loss[m].Check(logits.Shape(), labels); err != nil {
				return res, fmt.Errorf("micro-batch %d: %w", m, err)
			}
			l, c, grad := e.loss[m].Forward(logits, labels, scale)
			e.lossGrad[m] = grad
			res.loss += l
			res.correct += int64(c)
			res.samples += int64(e.loss[m].Count(labels))
			res.forwardNs += res.pass(in.Op, m, t0)
		case balance.OpSendAct:
			for _, name := range in.Tensors {
				if err := e.send(in.Peer, dataplane.Tag{Kind: dataplane.KindActivation, MicroBatch: uint32(m), Tensor: e.id[name]}, e.outs[m][e.outIdx[name]]); err != nil {
					return res, err
				}
			}
		case balance.OpRecvGrad:
			for _, name := range in.Tensors {
				t0 := time.Now()
				t, err := e.box.wait(boxKey{int32(in.Peer), dataplane.KindGradient, uint32(m), e.id[name]})
				res.waitNs += int64(time.Since(t0))
				if err != nil {
					return res, err
				}
				k := e.outIdx[name]
				pos := slices.Index(p.Outputs[k].To, e.group(in.Peer))
				if pos < 0 {
					return res, fmt.Errorf("stage %d: gradient of %q from stage %d, which does not read it", p.ID, name, in.Peer)
				}
				e.grads[m][k][pos] = t
			}
		case balance.OpBackward:
			t0 := time.Now()
			for k, o := range p.Outputs {
				e.dout[k] = e.outputGrad(m, k, o)
			}
			e.gin[m] = e.st.Backward(&ctx, e.slot[m], e.dout)
			backwards++
			res.backwardNs += res.pass(in.Op, m, t0)
		case balance.OpSendGrad:
			for _, name := range in.Tensors {
				k := e.inIdx[name]
				gr := e.gin[m][k]
				if gr == nil { // nn computes no gradient here: zeros, as in one process
					gr = e.zerosLike(name, e.ins[m][k])
				}
				if err := e.send(in.Peer, dataplane.Tag{Kind: dataplane.KindGradient, MicroBatch: uint32(m), Tensor: e.id[name]}, gr); err != nil {
					return res, err
				}
			}
		case balance.OpSendSum:
			k := 0
			for _, prm := range e.params {
				if prm.Trainable() {
					if err := e.send(in.Peer, dataplane.Tag{Kind: dataplane.KindSum, Tensor: uint32(k)}, prm.Grad); err != nil {
						return res, err
					}
					k++
				}
			}
			e.sumSent = append(e.sumSent, in.Peer)
		case balance.OpRecvSum:
			replace := backwards == 0 || in.Peer == e.lastReplica
			// A sum that the next instructions pass on goes on tensor by
			// tensor, as soon as each is added: the chain pipelines.
			var fwd []int
			for !replace && pc+1 < len(p.Program) && p.Program[pc+1].Op == balance.OpSendSum {
				pc++
				fwd = append(fwd, p.Program[pc].Peer)
			}
			t0 := time.Now()
			err := e.recvSum(in.Peer, replace, fwd)
			res.waitNs += int64(time.Since(t0))
			if err != nil {
				return res, err
			}
		case balance.OpSendTie:
			k := 0
			for _, l := range in.Tensors {
				for _, prm := range e.tiedIn[l] {
					if err := e.send(in.Peer, dataplane.Tag{Kind: dataplane.KindSum, Tensor: uint32(k)}, prm.Grad); err != nil {
						return res, err
					}
					k++
				}
			}
			e.tieSent = append(e.tieSent, in.Peer)
		case balance.OpRecvTie:
			t0 := time.Now()
			err := e.recvTie(in)
			res.waitNs += int64(time.Since(t0))
			if err != nil {
				return res, err
			}
		case balance.OpStep:
			t0 := time.Now()
			if err := e.sumTies(); err != nil {
				return res, err
			}
			res.waitNs += int64(time.Since(t0))
			e.pending = &pendingUpdate{step: global, lr: lr, scale: 1}
			if e.clip {
				e.pending.scale = 0
				res.gradNames, res.gradSumsq = e.normNames, make([]float64, len(e.normed))
				for i, p := range e.normed {
					res.gradSumsq[i] = nn.SumSquares(p)
				}
			}
		}
	}
	if e.turn != nil {
		e.turn.done()
	}
	// The step ends when everything it sent has left: the next step's
	// forward passes overwrite the tensors the queues still point to.
	t0 = time.Now()
	for _, pr := range e.peers {
		if err := pr.flush(); err != nil {
			return res, err
		}
	}
	res.waitNs += int64(time.Since(t0))
	return res, nil
}

// backwardInput runs the first half of micro-batch m's backward pass (the
// input gradients); OpWeight runs the rest.
func (e *stageEngine) backwardInput(ctx *nn.Ctx, m int) {
	for k, o := range e.spec.Plan.Outputs {
		e.dout[k] = e.outputGrad(m, k, o)
	}
	e.gin[m] = e.st.BackwardInput(ctx, e.slot[m], e.dout)
}

// recompute runs micro-batch m's forward pass again into its slot, from
// the inputs it kept, for the backward pass that follows. It computes what
// the first pass computed (same inputs, dropout seeds and batch
// statistics) and leaves the running statistics alone.
func (e *stageEngine) recompute(ctx *nn.Ctx, m int) error {
	for _, pr := range e.peers { // the slot's tensors may still be queued
		if err := pr.flush(); err != nil {
			return err
		}
	}
	ctx.Recompute = true
	e.outs[m] = e.st.Forward(ctx, e.slot[m], e.ins[m])
	ctx.Recompute = false
	return nil
}

// recvSum receives a sum of the stage's parameter gradients from replica
// peer: the prefix to start from or the total (replace), else the prefix
// that goes in front of the replica's own gradients, prefix + own; each
// tensor is then sent on to the replicas fwd.
func (e *stageEngine) recvSum(peer int, replace bool, fwd []int) error {
	for _, q := range e.sumSent { // the gradients are about to change
		if err := e.peers[q].flush(); err != nil {
			return err
		}
	}
	e.sumSent = e.sumSent[:0]
	k := 0
	for _, prm := range e.params {
		if !prm.Trainable() {
			continue
		}
		t, err := e.box.wait(boxKey{int32(peer), dataplane.KindSum, 0, uint32(k)})
		if err != nil {
			return err
		}
		if !nn.SameShape(t.Shape(), prm.Grad.Shape()) {
			return fmt.Errorf("stage %d: sum %d from replica %d has shape %v, want %v", e.spec.Plan.ID, k, peer, t.Shape(), prm.Grad.Shape())
		}
		own, sum := nn.F32(prm.Grad), nn.F32(t)
		if replace {
			copy(own, sum)
		} else {
			for i := range own {
				own[i] = sum[i] + own[i]
			}
		}
		for _, q := range fwd {
			if err := e.send(q, dataplane.Tag{Kind: dataplane.KindSum, Tensor: uint32(k)}, prm.Grad); err != nil {
				return err
			}
		}
		k++
	}
	e.sumSent = append(e.sumSent, fwd...)
	return nil
}

// settle makes the parameters hold the state after steps steps: the
// pending update is applied if its step is before that, else dropped with
// the gradients of the step it came from. A clipped update whose scale has
// not come is an error.
func (e *stageEngine) settle(steps int) error {
	if u := e.pending; u != nil && u.step < steps {
		if u.scale == 0 {
			return fmt.Errorf("the update of step %d waits for its gradients' clipping scale", u.step)
		}
		nn.ScaleGrads(e.params, u.scale)
		e.opt.SetLR(u.lr)
		e.opt.Step(e.params) // and zeroes the gradients
	} else if e.gradStep >= 0 {
		for _, prm := range e.params {
			if prm.Trainable() {
				clear(nn.F32(prm.Grad))
			}
		}
	}
	e.pending, e.gradStep = nil, -1
	return nil
}

// setClip gives the pending update of step its clipping scale.
func (e *stageEngine) setClip(step int, scale float32) error {
	if u := e.pending; u == nil || u.step != step {
		return fmt.Errorf("no update of step %d is pending", step)
	}
	if !(scale > 0 && scale <= 1) {
		return fmt.Errorf("clipping scale %v", scale)
	}
	e.pending.scale = scale
	return nil
}

// outputGrad is the gradient of output k for micro-batch m: the loss's for
// the graph output, else the gradients from the stages in To summed as a
// left fold in To order, the order in which one process sums them.
func (e *stageEngine) outputGrad(m, k int, o balance.StageOutput) *nn.Tensor {
	if len(o.To) == 0 {
		return e.lossGrad[m]
	}
	if !o.Grad { // no gradient flows back through this output
		return nil
	}
	gs := e.grads[m][k]
	if len(gs) == 1 {
		return gs[0]
	}
	a := e.acc[m][k]
	if a == nil || !nn.SameShape(a.Shape(), gs[0].Shape()) {
		a = nn.New(gs[0].Shape()...)
		e.acc[m][k] = a
	}
	av := nn.F32(a)
	copy(av, nn.F32(gs[0]))
	for _, gr := range gs[1:] {
		for i, v := range nn.F32(gr) {
			av[i] += v
		}
	}
	return a
}

func (e *stageEngine) zerosLike(name string, like *nn.Tensor) *nn.Tensor {
	z := e.zeros[name]
	if z == nil || !nn.SameShape(z.Shape(), like.Shape()) {
		z = nn.New(like.Shape()...)
		e.zeros[name] = z
	}
	return z
}

// sent is what the stage's links sent since the last call, by peer and
// kind.
func (e *stageEngine) sent() []*LinkSent {
	var out []*LinkSent
	for _, k := range slices.Sorted(maps.Keys(e.peers)) {
		p := e.peers[k]
		st := p.lk.Stats()
		out = append(out, sentOf(k, st.Sub(p.last))...)
		p.last = st
	}
	return out
}

func (e *stageEngine) send(to int, tag dataplane.Tag, t *nn.Tensor) error {
	p := e.peers[to]
	if p == nil {
		return fmt.Errorf("stage %d: no link to stage %d", e.spec.Plan.ID, to)
	}
	return p.send(tag, t)
}

// stateTensors lists a stage's state in the order GatherWeights sends it
// and RestoreStage reads it: per parameter or buffer its value, then (with
// withOpt) its optimizer tensors by name.
func stateTensors(params []*nn.Param, opt nn.Optimizer, withOpt bool) []*nn.Tensor {
	var ts []*nn.Tensor
	for _, p := range params {
		ts = append(ts, p.Value)
		if withOpt && p.Trainable() {
			st := opt.State(p)
			for _, k := range slices.Sorted(maps.Keys(st)) {
				ts = append(ts, st[k])
			}
		}
	}
	return ts
}

// gather sends the stage's state, its last update applied, to the
// coordinator.
func (e *stageEngine) gather(withOpt bool) error {
	if err := e.settle(math.MaxInt); err != nil {
		return err
	}
	for i, t := range stateTensors(e.params, e.opt, withOpt) {
		if err := e.send(balance.Coordinator, dataplane.Tag{Kind: dataplane.KindWeights, Tensor: uint32(i)}, t); err != nil {
			return err
		}
	}
	return e.peers[balance.Coordinator].flush()
}

// restore reads the stage's state, optimizer included, from the
// coordinator's link; the optimizer continues after steps updates.
func (e *stageEngine) restore(steps int64) error {
	for i, t := range stateTensors(e.params, e.opt, true) {
		got, err := e.box.wait(boxKey{int32(balance.Coordinator), dataplane.KindWeights, 0, uint32(i)})
		if err != nil {
			return err
		}
		if !nn.SameShape(got.Shape(), t.Shape()) {
			return fmt.Errorf("restore: state tensor %d has shape %v, want %v", i, got.Shape(), t.Shape())
		}
		copy(nn.F32(t), nn.F32(got))
	}
	e.opt.SetSteps(int(steps))
	return nil
}

func actKind(peer int) dataplane.Kind {
	if peer == balance.Coordinator {
		return dataplane.KindInput
	}
	return dataplane.KindActivation
}

// ---- Inbox: tensors received on all links, by tag ----

type boxKey struct {
	peer   int32
	kind   dataplane.Kind
	micro  uint32
	tensor uint32
}

type boxEntry struct {
	t         *nn.Tensor
	delivered int // tensors received under this key so far
	consumed  int
}

// inbox holds the latest tensor received under each key. A key is
// received once per step and the step ends before its next delivery, so
// one buffer per key is reused step after step.
type inbox struct {
	mu   sync.Mutex
	cond *sync.Cond
	m    map[boxKey]*boxEntry
	err  error
}

func newInbox() *inbox {
	b := &inbox{m: map[boxKey]*boxEntry{}}
	b.cond = sync.NewCond(&b.mu)
	return b
}

// buffer returns the tensor to receive key into.
func (b *inbox) buffer(k boxKey) *nn.Tensor {
	b.mu.Lock()
	defer b.mu.Unlock()
	if e := b.m[k]; e != nil {
		return e.t
	}
	return nil
}

func (b *inbox) deliver(k boxKey, t *nn.Tensor) {
	b.mu.Lock()
	e := b.m[k]
	if e == nil {
		e = &boxEntry{}
		b.m[k] = e
	}
	e.t = t
	e.delivered++
	b.mu.Unlock()
	b.cond.Broadcast()
}

// drop forgets key k, received and read once (an evaluation's keys are
// used once each).
func (b *inbox) drop(k boxKey) {
	b.mu.Lock()
	delete(b.m, k)
	b.mu.Unlock()
}

// stepDone marks the end of a step's reads of what it received: a reader
// that next hands out one of its buffers (buffer) then happens after them.
func (b *inbox) stepDone() {
	b.mu.Lock()
	b.mu.Unlock()
}

// fail makes every wait return err (the first failure wins).
func (b *inbox) fail(err error) {
	b.mu.Lock()
	if b.err == nil {
		b.err = err
	}
	b.mu.Unlock()
	b.cond.Broadcast()
}

// wait returns the next tensor under k, or the inbox's error.
func (b *inbox) wait(k boxKey) (*nn.Tensor, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for {
		if e := b.m[k]; e != nil && e.delivered > e.consumed {
			e.consumed++
			return e.t, nil
		}
		if b.err != nil {
			return nil, b.err
		}
		b.cond.Wait()
	}
}

// ---- Peer: one link with its reader and sender goroutines ----

type sendItem struct {
	tag dataplane.Tag
	t   *nn.Tensor
}

type peer struct {
	stage int
	lk    dataplane.Link
	last  dataplane.Stats // what lk had sent at the last step's end
	q     chan sendItem
	wg    sync.WaitGroup // pending sends
	done  sync.WaitGroup // the two goroutines
	emu   sync.Mutex
	err   error
}

func newPeer(stage int, lk dataplane.Link, box *inbox, broken func(error)) *peer {
	p := &peer{stage: stage, lk: lk, q: make(chan sendItem, 256)}
	p.done.Add(2)
	go func() { // reader
		defer p.done.Done()
		peer := int32(stage)
		for {
			tag, t, err := lk.RecvTo(func(tag dataplane.Tag) *nn.Tensor {
				return box.buffer(boxKey{peer, tag.Kind, tag.MicroBatch, tag.Tensor})
			})
			if err != nil {
				if !errors.Is(err, dataplane.ErrClosed) {
					err = fmt.Errorf("link with stage %d: %w", stage, err)
					box.fail(err)
					if broken != nil {
						broken(err)
					}
				}
				return
			}
			box.deliver(boxKey{peer, tag.Kind, tag.MicroBatch, tag.Tensor}, t)
		}
	}()
	go func() { // sender
		defer p.done.Done()
		for it := range p.q {
			if p.error() == nil {
				if err := lk.Send(it.tag, it.t); err != nil {
					p.emu.Lock()
					p.err = fmt.Errorf("link with stage %d: %w", stage, err)
					p.emu.Unlock()
					box.fail(p.err)
				}
			}
			p.wg.Done()
		}
	}()
	return p
}

func (p *peer) error() error {
	p.emu.Lock()
	defer p.emu.Unlock()
	return p.err
}

// send queues t; it does not wait for the transfer.
func (p *peer) send(tag dataplane.Tag, t *nn.Tensor) error {
	if err := p.error(); err != nil {
		return err
	}
	p.wg.Add(1)
	p.q <- sendItem{tag, t}
	// Let the sender write it now: with one CPU per node (GOMAXPROCS=1)
	// it would otherwise wait until the compute goroutine blocks or is
	// preempted, up to a whole pass later, and the next stage would idle.
	runtime.Gosched()
	return nil
}

// flush waits until every queued tensor has been written.
func (p *peer) flush() error {
	p.wg.Wait()
	return p.error()
}

func (p *peer) close() {
	p.lk.Close()
	close(p.q)
	p.done.Wait()
}

// marshalStageSpec and unmarshalStageSpec carry a StageSpec in SetupStage;
// decoding checks the job's spec (job.Checked), once, on the stage's node.
func marshalStageSpec(s StageSpec) ([]byte, error) { return json.Marshal(s) }

func unmarshalStageSpec(b []byte) (StageSpec, error) {
	var s StageSpec
	if err := json.Unmarshal(b, &s); err != nil {
		return s, fmt.Errorf("stage spec: %w", err)
	}
	return s, nil
}
