package balance

import (
	"container/heap"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/ppnode/ppnode/nn"
)

// Report is a simulated training step of a plan.
type Report struct {
	// StepTime is the time from the step's start to the last stage's
	// optimizer step; Throughput is samples per second.
	StepTime   float64 `json:"step_time_s"`
	Throughput float64 `json:"throughput_samples_per_s"`
	// BubbleFraction is the share of stage-time spent idle:
	// 1 - sum(busy) / (stages × step time).
	BubbleFraction float64       `json:"bubble_fraction"`
	Stages         []StageReport `json:"stages"`
	Links          []LinkReport  `json:"links"`
	// Events are every instruction's and transfer's interval, for Gantt
	// charts and traces.
	Events []Event `json:"-"`
}

// StageReport is one stage's share of the step (one executor's, of a
// stage with replicas).
type StageReport struct {
	ID int `json:"id"`
	// Group and Replica are the stage of the partition and the replica
	// (see StagePlan).
	Group   int    `json:"group"`
	Replica int    `json:"replica,omitempty"`
	Node    string `json:"node"`
	// Forward and Backward are the stage's pass times per micro-batch.
	Forward  float64 `json:"forward_s"`
	Backward float64 `json:"backward_s"`
	Busy     float64 `json:"busy_s"`
	// BusyFraction is Busy / step time; BubbleFraction its complement.
	BusyFraction   float64 `json:"busy_fraction"`
	BubbleFraction float64 `json:"bubble_fraction"`
	// PeakInFlight is the most micro-batches between forward and backward
	// at once; PeakMemory the stage's memory then: parameters, gradients,
	// optimizer state, the gradient sum a replica receives, and per
	// micro-batch in flight its layers' buffers and its received inputs
	// (recomputing: one set of layers' buffers, and the inputs per
	// micro-batch in flight).
	PeakInFlight int     `json:"peak_in_flight"`
	PeakMemory   float64 `json:"peak_memory_bytes"`
	// MemoryLimit is the node's memory (0: no limit).
	MemoryLimit int64 `json:"memory_limit_bytes,omitempty"`
	// Recompute is set when the stage recomputes its activations.
	Recompute bool `json:"recompute,omitempty"`
}

// LinkReport is the traffic on the link between two stages, one
// direction.
type LinkReport struct {
	From        int     `json:"from"`
	To          int     `json:"to"`
	Bytes       float64 `json:"bytes"`
	Busy        float64 `json:"busy_s"`
	Utilization float64 `json:"utilization"`
}

// Event is one interval of the simulated step: an instruction on a stage
// (Peer = -2 for compute) or a transfer on a link (Op OpSendAct,
// OpSendGrad or OpSendSum, Stage the sender, Peer the receiver).
type Event struct {
	Stage int     `json:"stage"`
	Op    Op      `json:"op"`
	Micro int     `json:"micro"`
	Peer  int     `json:"peer"`
	Start float64 `json:"start_s"`
	End   float64 `json:"end_s"`
	Bytes float64 `json:"bytes,omitempty"`
}

// Link reports whether the event is a transfer.
func (e Event) Link() bool { return e.Peer != noPeer }

const noPeer = -2

// simCosts prices a plan's instructions.
type simCosts interface {
	// compute is the duration of a compute instruction of stage s.
	compute(s int, op Op) float64
	// transfer is how long the message that instruction in of stage from
	// sends (activations, gradients or a gradient sum) occupies the link,
	// its latency and its bytes on the wire.
	transfer(from, to int, in Instr) (busy, latency, bytes float64)
	// input is when micro-batch m's inputs reach stage s: the feeder sends
	// every stage's, micro-batch after micro-batch of its own, from the
	// step's start.
	input(s, m int, tensors []string) float64
}

// unitCosts make every pass take one unit and transfers nothing, to check
// a plan's programs for matched transfers and deadlock.
type unitCosts struct{}

func (unitCosts) compute(s int, op Op) float64 {
	switch op {
	case OpForward, OpBackward, OpRecompute, OpBackwardInput, OpWeight:
		return 1
	}
	return 0
}
func (unitCosts) transfer(from, to int, in Instr) (float64, float64, float64) {
	return 0, 0, 0
}
func (unitCosts) input(s, m int, tensors []string) float64 { return 0 }

// profileCosts prices a plan by a model profile on a cluster.
type profileCosts struct {
	fwd, bwd, upd []float64 // per stage
	wgt           []float64 // per stage: the part of bwd that OpWeight runs
	node          []int     // per stage, network index
	micros        [][]int   // per stage, its micro-batches, ascending
	sum           []float64 // per stage, the bytes of its gradient sum
	net           *network
	bytes         map[string]float64 // tensor -> bytes per micro-batch
	tied          map[string]float64 // layer -> bytes of its tied parameters
}

func (c *profileCosts) compute(s int, op Op) float64 {
	switch op {
	case OpForward, OpRecompute:
		return c.fwd[s]
	case OpBackward:
		return c.bwd[s]
	case OpBackwardInput:
		return c.bwd[s] - c.wgt[s]
	case OpWeight:
		return c.wgt[s]
	case OpStep:
		return c.upd[s]
	}
	return 0
}

func (c *profileCosts) transfer(from, to int, in Instr) (float64, float64, float64) {
	if from == Coordinator || to == Coordinator {
		return 0, 0, 0
	}
	var b float64
	for _, t := range in.Tensors {
		b += c.bytes[t]
	}
	f := flowAct
	switch in.Op {
	case OpSendGrad:
		f = flowGrad
	case OpSendSum:
		f, b = flowGrad, c.sum[from]
	case OpSendTie:
		f, b = flowGrad, 0
		for _, l := range in.Tensors {
			b += c.tied[l]
		}
	}
	l := c.net.link(c.node[from], c.node[to])
	return l.occupies(b, f), l.Latency, l.wire(b, f)
}

func (c *profileCosts) input(s, m int, tensors []string) float64 {
	if c.net.feeder < 0 || c.net.feeder == c.node[s] {
		return 0
	}
	var b float64
	for _, t := range tensors {
		b += c.bytes[t]
	}
	l := c.net.link(c.net.feeder, c.node[s])
	k, _ := slices.BinarySearch(c.micros[s], m) // the feeder sends them in turn
	return float64(k+1)*l.occupies(b, flowInput) + l.Latency
}

// SimOptions configure a simulation.
type SimOptions struct {
	// Optimizer is "sgd" (momentum: one state tensor per parameter, the
	// default), "adam" or "adamw" (two) or "none".
	Optimizer string
}

func optimizerSlots(name string) (int, error) {
	switch name {
	case "", "sgd":
		return 1, nil
	case "adam", "adamw":
		return 2, nil
	case "none":
		return 0, nil
	}
	return 0, fmt.Errorf("%w: unknown optimizer %q (want sgd, adam, adamw or none)", ErrPlan, name)
}

// Simulate replays one training step of p event by event: each stage runs
// its program in order, compute takes the profiled time scaled by the
// node's speed, a send occupies its link (one transfer at a time per
// direction, in the order sent) and lets the stage go on, a receive waits
// for the message. It returns the step time, the busy and bubble
// fractions and peak memory per stage, and the links' use.
func Simulate(p *Plan, g *nn.Graph, prof *ModelProfile, c *Cluster, o SimOptions) (*Report, error) {
	net, slots, err := prepare(g, prof, c, o.Optimizer)
	if err != nil {
		return nil, err
	}
	return simulate(p, newLayout(g, prof), net, slots)
}

// prepare checks the profile against the model and resolves the cluster and
// the optimizer's state slots, the inputs of both Search and Simulate.
func prepare(g *nn.Graph, prof *ModelProfile, c *Cluster, optimizer string) (*network, int, error) {
	if err := prof.Check(g); err != nil {
		return nil, 0, err
	}
	net, err := c.resolve(prof)
	if err != nil {
		return nil, 0, err
	}
	slots, err := optimizerSlots(optimizer)
	if err != nil {
		return nil, 0, err
	}
	return net, slots, nil
}

// tiedBytes is, per layer holding copies of tied parameters, their bytes.
func tiedBytes(g *nn.Graph) map[string]float64 {
	tied := map[string]bool{}
	for _, grp := range nn.Ties(g.Params()) {
		tied[grp[0].Name] = true
	}
	out := map[string]float64{}
	for _, n := range g.Nodes {
		for _, prm := range n.Layer.Params() {
			if prm.Trainable() && tied[prm.Name] {
				out[n.Name] += float64(4 * nn.Size(prm.Value.Shape()))
			}
		}
	}
	return out
}

func simulate(p *Plan, l *layout, net *network, slots int) (*Report, error) {
	g, prof := l.g, l.prof
	b := p.MicroBatchSize
	pc := &profileCosts{net: net, bytes: map[string]float64{}, tied: tiedBytes(g)}
	static := make([]float64, len(p.Stages))
	perMicro := make([]float64, len(p.Stages)) // layers' buffers and inputs
	inBytes := make([]float64, len(p.Stages))  // inputs alone
	replicated := map[int]bool{}               // stages with replicas
	for _, st := range p.Stages {
		if st.Replica > 0 {
			replicated[st.Group] = true
		}
	}
	for s, st := range p.Stages {
		ni, ok := net.index[st.Node]
		if !ok {
			return nil, fmt.Errorf("%w: stage %d runs on node %q, which is not in the cluster", ErrUnknownNode, s, st.Node)
		}
		sp := net.nodes[ni].Speed
		var f, bw, wg, u, train float64
		for _, name := range st.Layers {
			j, ok := l.nodePos[name]
			if !ok {
				return nil, fmt.Errorf("%w: stage %d names %q", ErrUnknownLayer, s, name)
			}
			lp := &prof.Layers[j]
			f += lp.Forward.At(b)
			bw += lp.Backward.At(b)
			if _, ok := g.Nodes[j].Layer.(nn.SplitLayer); ok && !nn.Frozen(g.Nodes[j].Layer) {
				// Weight and input gradients: a product each of the
				// same size. A frozen layer's backward pass (as profiled)
				// is its input gradients only.
				wg += lp.Backward.At(b) / 2
			}
			u += lp.Update
			static[s] += float64(lp.ParamBytes) + float64(lp.TrainableBytes)*float64(1+slots)
			perMicro[s] += lp.SlotBytes * float64(b)
			train += float64(lp.TrainableBytes)
		}
		if replicated[st.Group] {
			// A replica also holds the gradient sum it receives.
			static[s] += train
			pc.sum = append(pc.sum, train)
		} else {
			pc.sum = append(pc.sum, 0)
		}
		pc.micros = append(pc.micros, st.Micros())
		for _, in := range st.Inputs {
			if j, ok := l.nodePos[in.Name]; ok {
				inBytes[s] += l.tensorBytes(j, b)
			} else {
				inBytes[s] += float64(nn.Size(shapeOf(g, in.Name)) * 4 * b)
			}
		}
		perMicro[s] += inBytes[s]
		pc.fwd = append(pc.fwd, f/sp)
		pc.bwd = append(pc.bwd, bw/sp)
		pc.wgt = append(pc.wgt, wg/sp)
		pc.upd = append(pc.upd, u/sp)
		pc.node = append(pc.node, ni)
	}
	for j := range g.Nodes {
		pc.bytes[g.Nodes[j].Name] = l.tensorBytes(j, b)
	}
	for k, name := range g.InputNames {
		pc.bytes[name] = float64(4 * nn.Size(g.InputShapes[k]) * b)
	}
	r, err := replay(p, pc)
	if err != nil {
		return nil, err
	}
	for s := range r.Stages {
		st := &r.Stages[s]
		st.Node, st.Group, st.Replica = p.Stages[s].Node, p.Stages[s].Group, p.Stages[s].Replica
		st.Forward, st.Backward = pc.fwd[s], pc.bwd[s]
		st.PeakMemory = static[s] + float64(st.PeakInFlight)*perMicro[s]
		if p.Stages[s].Recompute {
			st.Recompute = true
			st.PeakMemory = static[s] + perMicro[s] - inBytes[s] + float64(max(st.PeakInFlight, 1))*inBytes[s]
		}
		st.MemoryLimit = net.nodes[pc.node[s]].Memory
	}
	r.Throughput = float64(p.MicroBatches*b) / r.StepTime
	return r, nil
}

type simItem struct {
	t    float64
	exec int
}

type simHeap []simItem

func (h simHeap) Len() int { return len(h) }
func (h simHeap) Less(i, j int) bool {
	if h[i].t != h[j].t {
		return h[i].t < h[j].t
	}
	return h[i].exec < h[j].exec
}
func (h simHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *simHeap) Push(x any)   { *h = append(*h, x.(simItem)) }
func (h *simHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// msgKey is a message: its sender and receiver, the instruction that
// sends it, and its micro-batch (0 for a sum).
type msgKey struct {
	from, to int
	op       Op
	m        int
}

// sender is the instruction that sends what a receive waits for.
func sender(op Op) Op {
	switch op {
	case OpRecvAct:
		return OpSendAct
	case OpRecvGrad:
		return OpSendGrad
	case OpRecvTie:
		return OpSendTie
	}
	return OpSendSum
}

// lastReplica reports whether executor e of p is the last replica of its
// stage (what it sends its replicas is the total, not a prefix).
func lastReplica(p *Plan, e int) bool {
	return e+1 >= len(p.Stages) || p.Stages[e+1].Replica == 0
}

// replay runs the plan's executors against costs in time order: each
// stage, or under the interleaved schedule each node, runs its
// instructions in order, one at a time.
func replay(p *Plan, c simCosts) (*Report, error) {
	S := len(p.Stages)
	execs, err := p.executors()
	if err != nil {
		return nil, err
	}
	E := len(execs)
	pcs := make([]int, E) // per executor, into its order
	done := make([]float64, S)
	busy := make([]float64, S)
	inflight := make([]int, S)
	peak := make([]int, S)
	arrived := map[msgKey]float64{}
	began := map[msgKey]float64{} // when a message started to leave
	sent := map[msgKey][]string{}
	// A sum received from the replica before and passed straight on: the
	// runtime forwards it tensor by tensor, so its sends overlap its
	// arrival (the received message's start and end, per stage).
	fwdFrom, fwdTo := make([]float64, S), make([]float64, S)
	// reached[s] is when stage s reached its instruction reachedPC[s].
	reached, reachedPC := make([]float64, S), make([]int, S)
	for s := range reachedPC {
		reachedPC[s] = -1
	}
	waiting := map[msgKey]int{} // message -> the executor waiting for it
	blockedAt := make([]float64, E)
	linkFree := map[[2]int]float64{}
	linkStats := map[[2]int]*LinkReport{}
	var events []Event
	h := &simHeap{}
	for s := 0; s < S; s++ {
		if len(p.Stages[s].Program) == 0 {
			return nil, fmt.Errorf("%w: stage %d has an empty program", ErrPlan, s)
		}
	}
	for e := 0; e < E; e++ {
		heap.Push(h, simItem{0, e})
	}
	finished := 0
	for h.Len() > 0 {
		it := heap.Pop(h).(simItem)
		e, t := it.exec, it.t
		sl := execs[e][pcs[e]]
		s, pc := sl.Stage, sl.PC
		prog := p.Stages[s].Program
		in := prog[pc]
		next := t
		if in.Op != OpSendSum {
			fwdFrom[s] = -1
		}
		if reachedPC[s] != pc {
			reachedPC[s], reached[s] = pc, t
		}
		switch in.Op {
		case OpRecvAct, OpRecvGrad, OpRecvSum, OpRecvTie:
			if in.Peer == Coordinator {
				if in.Op != OpRecvAct {
					return nil, fmt.Errorf("%w: stage %d waits for gradients from the coordinator", ErrPlan, s)
				}
				next = max(t, c.input(s, in.Micro, in.Tensors))
				break
			}
			if in.Peer < 0 || in.Peer >= S || in.Peer == s {
				return nil, fmt.Errorf("%w: stage %d receives from stage %d", ErrPlan, s, in.Peer)
			}
			k := msgKey{in.Peer, s, sender(in.Op), in.Micro}
			if !in.Op.perMicro() {
				k.m = 0
			}
			arrival, ok := arrived[k]
			if !ok {
				waiting[k] = e
				blockedAt[e] = t
				continue
			}
			if !slices.Equal(sent[k], in.Tensors) {
				return nil, fmt.Errorf("%w: stage %d expects %v of micro-batch %d from stage %d, which sends %v", ErrPlan, s, in.Tensors, in.Micro, in.Peer, sent[k])
			}
			delete(arrived, k)
			next = max(t, arrival)
			if in.Op == OpRecvSum && pc+1 < len(prog) && prog[pc+1].Op == OpSendSum && !lastReplica(p, in.Peer) {
				fwdFrom[s], fwdTo[s] = max(began[k], reached[s]), arrival
			}
		case OpSendAct, OpSendGrad, OpSendSum, OpSendTie:
			if in.Peer < 0 || in.Peer >= S || in.Peer == s {
				return nil, fmt.Errorf("%w: stage %d sends to stage %d", ErrPlan, s, in.Peer)
			}
			k := msgKey{s, in.Peer, in.Op, in.Micro}
			if !in.Op.perMicro() {
				k.m = 0
			}
			if _, dup := sent[k]; dup {
				return nil, fmt.Errorf("%w: stage %d sends micro-batch %d to stage %d twice", ErrPlan, s, in.Micro, in.Peer)
			}
			bt, lat, bytes := c.transfer(s, in.Peer, in)
			lk := [2]int{s, in.Peer}
			start := max(t, linkFree[lk])
			end := start + bt
			if in.Op == OpSendSum && fwdFrom[s] >= 0 {
				start = max(fwdFrom[s], linkFree[lk])
				end = max(start+bt, fwdTo[s])
			}
			linkFree[lk] = end
			arrival := end + lat
			began[k] = start
			sent[k] = in.Tensors
			arrived[k] = arrival
			ls := linkStats[lk]
			if ls == nil {
				ls = &LinkReport{From: s, To: in.Peer}
				linkStats[lk] = ls
			}
			ls.Bytes += bytes
			ls.Busy += bt
			events = append(events, Event{Stage: s, Op: in.Op, Micro: in.Micro, Peer: in.Peer, Start: start, End: arrival, Bytes: bytes})
			if w, ok := waiting[k]; ok {
				delete(waiting, k)
				heap.Push(h, simItem{max(blockedAt[w], arrival), w})
			}
		default:
			d := c.compute(s, in.Op)
			if in.Op == OpForward {
				inflight[s]++
				peak[s] = max(peak[s], inflight[s])
			}
			if in.Op == OpBackward || in.Op == OpWeight {
				inflight[s]--
			}
			next = t + d
			busy[s] += d
			events = append(events, Event{Stage: s, Op: in.Op, Micro: in.Micro, Peer: noPeer, Start: t, End: next})
		}
		if pc == len(prog)-1 {
			done[s] = next
		}
		pcs[e]++
		if pcs[e] == len(execs[e]) {
			finished++
			continue
		}
		heap.Push(h, simItem{next, e})
	}
	if finished < E {
		var stuck []string
		for e := 0; e < E; e++ {
			if pcs[e] < len(execs[e]) {
				sl := execs[e][pcs[e]]
				stuck = append(stuck, fmt.Sprintf("stage %d at %v", sl.Stage, p.Stages[sl.Stage].Program[sl.PC]))
			}
		}
		return nil, fmt.Errorf("%w: %s", ErrDeadlock, strings.Join(stuck, "; "))
	}
	if len(arrived) > 0 {
		for k := range arrived {
			return nil, fmt.Errorf("%w: stage %d sends micro-batch %d to stage %d, which never receives it", ErrPlan, k.from, k.m, k.to)
		}
	}
	r := &Report{Events: events}
	for _, d := range done {
		r.StepTime = max(r.StepTime, d)
	}
	var total float64
	for s := 0; s < S; s++ {
		sr := StageReport{ID: s, Busy: busy[s], PeakInFlight: peak[s]}
		if r.StepTime > 0 {
			sr.BusyFraction = busy[s] / r.StepTime
			sr.BubbleFraction = 1 - sr.BusyFraction
		}
		total += busy[s]
		r.Stages = append(r.Stages, sr)
	}
	if r.StepTime > 0 {
		// Of the executors' time: an interleaved node's chunks share it.
		r.BubbleFraction = 1 - total/(float64(E)*r.StepTime)
	}
	for _, ls := range linkStats {
		if r.StepTime > 0 {
			ls.Utilization = ls.Busy / r.StepTime
		}
		r.Links = append(r.Links, *ls)
	}
	slices.SortFunc(r.Links, func(a, b LinkReport) int {
		if a.From != b.From {
			return a.From - b.From
		}
		return a.To - b.To
	})
	if math.IsNaN(r.StepTime) {
		return nil, fmt.Errorf("%w: step time is not a number", ErrProfile)
	}
	return r, nil
}
