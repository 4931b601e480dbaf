package balance

import (
	"cmp"
	"fmt"
	"math"
	"reflect"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/ppnode/ppnode/nn"
)

// Partitioner names.
const (
	Uniform  = "uniform"  // equal numbers of layers (units) per node, nodes in the given order
	Params   = "params"   // equal parameter bytes per node (DeepSpeed's default)
	Balanced = "balanced" // BaPipe-style dynamic programme over cuts and nodes
	GraphPP  = "graph"    // GraphPipe-style stage DAG for multi-branch models
)

// Options configure a plan search.
type Options struct {
	// Partitioner is Uniform, Params, Balanced (the default), GraphPP, or
	// a partition description (see ParseSpec).
	Partitioner string
	// Schedule is "auto" (the default: GPipe, 1F1B or graph, and
	// zero-bubble where it applies, see scheduleKinds), "gpipe", "1f1b",
	// "graph", "zb" or "interleaved".
	Schedule string
	// Chunks is, under the interleaved schedule, the chunks (stages) per
	// node; 0 tries InterleavedChunks and keeps the fastest.
	Chunks int
	// Batch is the mini-batch size in samples (required).
	Batch int
	// MicroBatches is M; 0 tries every M that divides Batch up to
	// MaxMicroBatches (default 32).
	MicroBatches    int
	MaxMicroBatches int
	// Optimizer is "sgd" (default), "adam", "adamw" or "none": it sets the
	// optimizer state kept per parameter.
	Optimizer string
	// Model is recorded in the plan.
	Model string
	// Keep bounds how many partitions of the dynamic programme per
	// (schedule, M) are simulated (default 4).
	Keep int
	// Workers bounds the goroutines that solve the dynamic programmes at
	// once; 0 or 1 solves them one after the other on the caller's
	// goroutine (a job's pure core). The result is the same either way.
	Workers int
	// Replicas lets the balanced and graph partitioners run a stage on
	// several nodes (replicas, see PartStage) as well; the plans without
	// replicas are candidates still.
	Replicas bool
	// ChainedSums makes the replicas of a stage sum their gradients in the
	// deterministic order (Plan.ChainedSums).
	ChainedSums bool
	// Recompute is "none" (the default: stages keep their activations),
	// "auto" (a stage recomputes its activations where its node's memory
	// requires it, StagePlan.Recompute) or "all".
	Recompute string
}

// Recomputation choices (Options.Recompute).
const (
	RecomputeNone = "none"
	RecomputeAuto = "auto"
	RecomputeAll  = "all"
)

// CheckRecompute validates a recomputation option.
func CheckRecompute(s string) error {
	switch s {
	case "", RecomputeNone, RecomputeAuto, RecomputeAll:
		return nil
	}
	return fmt.Errorf("%w: unknown recomputation %q (want none, auto or all)", ErrPlan, s)
}

// Result is the best plan a search found.
type Result struct {
	Plan   *Plan
	Report *Report
	// Spec is the plan's partition as a description.
	Spec string
	// Simulated counts the plans the search simulated.
	Simulated int
}

// Search finds the plan with the least simulated step time for the
// partitioner, over the schedules and micro-batch counts the options allow,
// among those whose every stage fits its node's memory. It reads no clock,
// and with o.Workers at most 1 starts no goroutine: the same inputs give the
// same plan.
func Search(g *nn.Graph, prof *ModelProfile, c *Cluster, o Options) (*Result, error) {
	net, slots, err := prepare(g, prof, c, o.Optimizer)
	if err != nil {
		return nil, err
	}
	if o.Batch < 1 {
		return nil, fmt.Errorf("%w: batch %d", ErrPlan, o.Batch)
	}
	if o.Keep <= 0 {
		o.Keep = 4
	}
	if err := CheckRecompute(o.Recompute); err != nil {
		return nil, err
	}
	if o.Recompute == "" {
		o.Recompute = RecomputeNone
	}
	Ms, err := microBatchCounts(o)
	if err != nil {
		return nil, err
	}
	var nodes []string
	for _, n := range net.nodes {
		nodes = append(nodes, n.Name)
	}
	l := newLayout(g, prof)
	if o.Partitioner == "" {
		o.Partitioner = Balanced
	}
	if o.Schedule == Interleaved.String() {
		return searchInterleaved(l, net, slots, o, Ms)
	}
	if o.Chunks != 0 {
		return nil, fmt.Errorf("%w: %d chunks per node under the %s schedule (chunks are for --schedule interleaved)", ErrPlan, o.Chunks, o.Schedule)
	}
	var fixed *Partition
	switch o.Partitioner {
	case Uniform:
		fixed = uniformPartition(l, nodes)
	case Params:
		fixed = paramsPartition(l, nodes)
	case Balanced, GraphPP:
	default:
		if fixed, err = ParseSpec(g, o.Partitioner, nodes); err != nil {
			return nil, err
		}
	}
	var fixedSG *stageGraph
	if fixed != nil {
		if fixedSG, err = newStageGraph(g, fixed, net.index); err != nil {
			return nil, err
		}
		if Ms, err = fixed.microBatchCounts(Ms); err != nil {
			return nil, err
		}
	}
	graph := o.Partitioner == GraphPP && len(findRegions(l, l.costsFor(1, slots))) > 0

	// The dynamic programmes for every (M, schedule) pair are independent
	// and read only l and net: solve them on up to o.Workers goroutines,
	// then simulate and pick in the fixed order below, so the result does
	// not depend on timing.
	// When memory binds nowhere, GPipe and 1F1B (which differ only in the
	// micro-batches they keep in flight) pose the same problem: solve it once.
	type pair struct {
		M     int
		kind  Schedule
		parts []*stageGraph
		same  *pair // solved by this pair
	}
	var pairs []*pair
	for _, M := range Ms {
		var first *pair
		free := memoryFree(l.costsFor(o.Batch/M, slots), net, M)
		var oneF *pair
		for _, kind := range scheduleKinds(o.Schedule) {
			if kind == ZeroBubble && o.Schedule != "zb" && o.Recompute == RecomputeAll {
				continue // auto: every stage was asked to recompute, which zb cannot
			}
			pr := &pair{M: M, kind: kind}
			switch {
			case first != nil && free:
				pr.same = first
			case kind == ZeroBubble && oneF != nil && o.Recompute == RecomputeNone:
				// zb's partitions are 1F1B's: the same micro-batches
				// in flight, and neither recomputes.
				pr.same = oneF
			}
			if first == nil {
				first = pr
			}
			if kind == OneFOneB {
				oneF = pr
			}
			pairs = append(pairs, pr)
		}
	}
	solvePair := func(pr *pair) {
		M := pr.M
		p := newProblem(l, l.costsFor(o.Batch/M, slots), net, inflightFor(pr.kind, M), graph)
		p.recompute = o.Recompute != RecomputeNone && pr.kind != ZeroBubble // a weight pass needs the activations
		sols := solve(p, M, o.Keep, graph)
		var parts []*Partition
		for _, segs := range sols {
			parts = append(parts, segmentsPartition(l, p, segs, nodes))
		}
		if o.Replicas && M > 1 && len(nodes) > 1 {
			p.allowReplicas(M, min(len(nodes), M), o.ChainedSums)
			for _, segs := range solve(p, M, o.Keep, graph) {
				part := segmentsPartition(l, p, segs, nodes)
				if !slices.ContainsFunc(parts, func(q *Partition) bool { return reflect.DeepEqual(q, part) }) {
					parts = append(parts, part)
				}
			}
		}
		for _, part := range parts {
			sg, err := newStageGraph(g, part, net.index)
			if err != nil {
				continue // a branch grouping whose gradients cannot be summed exactly
			}
			pr.parts = append(pr.parts, sg)
		}
	}
	var wg sync.WaitGroup
	sem := make(chan struct{}, max(o.Workers, 1))
	for _, pr := range pairs {
		if fixedSG != nil {
			pr.parts = []*stageGraph{fixedSG}
			continue
		}
		if pr.same != nil {
			continue
		}
		if o.Workers <= 1 {
			solvePair(pr)
			continue
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			solvePair(pr)
		}()
	}
	wg.Wait()
	for _, pr := range pairs {
		if pr.same != nil {
			pr.parts = pr.same.parts
		}
	}

	// bestZB is the fastest zero-bubble plan that fits, kept apart: auto
	// takes it only when it beats bestFit by zbMargin.
	var bestFit, bestZB, bestAny *candidate
	simulated, chains := 0, 0 // chains: partitions skipped as not a chain of stages
	for _, pr := range pairs {
		M, kind, parts := pr.M, pr.kind, pr.parts
		b := o.Batch / M
		for _, sg := range parts {
			sched := kind
			if kind == ZeroBubble && (!sg.isPath() || sg.part.Replicated()) {
				if o.Schedule == "zb" {
					chains++ // auto has the other schedules for it
				}
				continue
			}
			if kind != GPipe && kind != ZeroBubble {
				if sg.isPath() {
					sched = OneFOneB
				} else {
					sched = GraphSchedule
				}
				if o.Schedule == "1f1b" && sched != OneFOneB {
					chains++
					continue
				}
			}
			run := func(rec []bool) (*Plan, *Report, error) {
				plan, err := sg.plan(sched, M, b, o.ChainedSums, rec)
				if err != nil {
					return nil, nil, err
				}
				plan.Model, plan.Partitioner = o.Model, o.Partitioner
				if fixed != nil && o.Partitioner != Uniform && o.Partitioner != Params {
					plan.Partitioner = "spec"
				}
				rep, err := simulate(plan, l, net, slots)
				simulated++
				return plan, rep, err
			}
			rec := make([]bool, len(sg.layers))
			recompute := o.Recompute
			if sched == ZeroBubble {
				recompute = RecomputeNone // a weight pass needs the activations
			}
			if recompute == RecomputeAll {
				for s := range rec {
					rec[s] = true
				}
			}
			plan, rep, err := run(rec)
			if err != nil {
				return nil, err
			}
			// auto: the stages over their node's memory recompute, until
			// every stage fits or none over it can recompute more.
			for recompute == RecomputeAuto && !(&candidate{rep: rep}).fits() {
				more := false
				for _, st := range rep.Stages {
					if st.MemoryLimit > 0 && st.PeakMemory > float64(st.MemoryLimit) && !rec[st.Group] {
						rec[st.Group], more = true, true
					}
				}
				if !more {
					break
				}
				if plan, rep, err = run(rec); err != nil {
					return nil, err
				}
			}
			cd := &candidate{plan: plan, rep: rep, sg: sg}
			if cd.fits() {
				best := &bestFit
				if sched == ZeroBubble {
					best = &bestZB
				}
				if *best == nil || cd.better(*best) {
					*best = cd
				}
			} else if bestAny == nil || cd.overuse() < bestAny.overuse() {
				bestAny = cd
			}
		}
	}
	if simulated == 0 && chains == 0 {
		// The partitioner found no partition whose stages fit their
		// nodes' memory.
		return nil, fmt.Errorf("%w: no partition over %d node(s) fits their memory (try more nodes, fewer micro-batches in flight or a smaller model)", ErrNoFit, len(nodes))
	}
	if simulated == 0 {
		return nil, fmt.Errorf("%w: the %s schedule needs stages that form a chain (zb: without replicas), and this partition is not; use --schedule graph", ErrPlan, o.Schedule)
	}
	if bestZB != nil && (bestFit == nil || bestZB.rep.StepTime < (1-zbMargin)*bestFit.rep.StepTime) {
		bestFit = bestZB
	}
	if bestFit == nil {
		if bestAny == nil {
			return nil, fmt.Errorf("%w: no stage of any partition fits (try more nodes, fewer micro-batches in flight or a smaller model)", ErrNoFit)
		}
		var over []string
		for _, s := range bestAny.rep.Stages {
			if s.MemoryLimit > 0 && s.PeakMemory > float64(s.MemoryLimit) {
				over = append(over, fmt.Sprintf("stage %d on %s needs %s of %s", s.ID, s.Node, fmtBytes(s.PeakMemory), fmtBytes(float64(s.MemoryLimit))))
			}
		}
		hint := ""
		if o.Recompute == RecomputeNone {
			hint = " (recomputing activations, --recompute auto, may make it fit)"
		}
		return nil, fmt.Errorf("%w: the closest plan (%s, M=%d): %s%s", ErrNoFit, bestAny.plan.Schedule, bestAny.plan.MicroBatches, strings.Join(over, "; "), hint)
	}
	return &Result{Plan: bestFit.plan, Report: bestFit.rep, Spec: FormatSpec(g, bestFit.sg.part), Simulated: simulated}, nil
}

// microBatchCounts keeps of Ms the micro-batch counts that p's replicated
// stages can share: their shares add up to M, or M gives each of their
// nodes one at least.
func (p *Partition) microBatchCounts(Ms []int) ([]int, error) {
	var out []int
	var first error
	for _, M := range Ms {
		var err error
		for s := range p.Stages {
			if _, err = p.Stages[s].split(s, M); err != nil {
				break
			}
		}
		if err == nil {
			out = append(out, M)
		} else if first == nil {
			first = err
		}
	}
	switch {
	case len(out) > 0:
		return out, nil
	case len(Ms) == 1:
		return nil, first
	}
	return nil, fmt.Errorf("%w: the partition's replicated stages fit none of the micro-batch counts %v (shares add up to M; each node needs one)", ErrPlan, Ms)
}

// memoryFree reports whether the whole model with M micro-batches in flight
// fits on every node, so that no memory limit can bind in the partitioner.
func memoryFree(c *costs, net *network, M int) bool {
	need := c.static[c.U] + float64(M)*(c.slot[c.U]+slices.Max(c.act))
	for i := range net.nodes {
		if need > net.memLimit(i) {
			return false
		}
	}
	return true
}

type candidate struct {
	plan *Plan
	rep  *Report
	sg   *stageGraph
}

func (c *candidate) fits() bool { return c.overuse() <= 1 }

// overuse is the largest ratio of a node's peak memory (its stages',
// added: the chunks of an interleaved node) to its memory.
func (c *candidate) overuse() float64 {
	need, limit := map[string]float64{}, map[string]int64{}
	for _, s := range c.rep.Stages {
		need[s.Node] += s.PeakMemory
		limit[s.Node] = s.MemoryLimit
	}
	u := 0.0
	for n, m := range need {
		if limit[n] > 0 {
			u = max(u, m/float64(limit[n]))
		}
	}
	return u
}

func (c *candidate) peak() float64 {
	m := 0.0
	for _, s := range c.rep.Stages {
		m = max(m, s.PeakMemory)
	}
	return m
}

// better orders candidates: shorter step, then less peak memory, then
// fewer stages (the earlier candidate wins a full tie).
func (c *candidate) better(d *candidate) bool {
	a, b := c.rep.StepTime, d.rep.StepTime
	if math.Abs(a-b) > 1e-9*max(a, b) {
		return a < b
	}
	if c.peak() != d.peak() {
		return c.peak() < d.peak()
	}
	return len(c.plan.Stages) < len(d.plan.Stages)
}

func microBatchCounts(o Options) ([]int, error) {
	if o.MicroBatches > 0 {
		if o.Batch%o.MicroBatches != 0 {
			return nil, fmt.Errorf("%w: %d micro-batches do not divide the batch of %d (uneven micro-batches are not supported)", ErrPlan, o.MicroBatches, o.Batch)
		}
		return []int{o.MicroBatches}, nil
	}
	if o.MicroBatches < 0 {
		return nil, fmt.Errorf("%w: %d micro-batches", ErrPlan, o.MicroBatches)
	}
	mx := o.MaxMicroBatches
	if mx <= 0 {
		mx = 32
	}
	var out []int
	for m := 1; m <= min(mx, o.Batch); m++ {
		if o.Batch%m == 0 {
			out = append(out, m)
		}
	}
	return out, nil
}

// zbMargin is how much shorter auto wants the zero-bubble plan's
// simulated step than the best other plan's before it takes it. The
// simulator prices a weight pass at half its layer's backward pass, while
// the split passes run two smaller GEMMs where one ran and zb keeps S
// micro-batches in flight on every stage; measured side by side
// (BENCHMARKS.md, "Zero-bubble schedule against 1F1B"), zb's gain was below
// its prediction by 5 to 10 points. A plan predicted less than 5% faster
// may well run slower, and costs more memory for nothing.
const zbMargin = 0.05

// scheduleKinds is the schedules a search tries for the option s (OneFOneB
// stands for the graph schedule on a DAG of stages). auto tries GPipe, 1F1B
// and zero-bubble; zero-bubble only on chains of stages without replicas,
// without recomputation (a weight pass needs the activations; its extra
// memory, S micro-batches in flight on every stage, is the simulator's to
// count) and only by zbMargin. auto does not try interleaved: on nodes
// that share cores or run under CPU quotas it ran slower than simulated
// (each micro-batch crosses every node v times), and a job asks for it
// with --schedule interleaved.
func scheduleKinds(s string) []Schedule {
	switch s {
	case "gpipe":
		return []Schedule{GPipe}
	case "1f1b", "graph":
		return []Schedule{OneFOneB}
	case "zb":
		return []Schedule{ZeroBubble}
	}
	return []Schedule{GPipe, OneFOneB, ZeroBubble}
}

// CheckSchedule validates a schedule option.
func CheckSchedule(s string) error {
	switch s {
	case "", "auto", "gpipe", "1f1b", "graph", "zb", "interleaved":
		return nil
	}
	return fmt.Errorf("%w: unknown schedule %q (want auto, gpipe, 1f1b, graph, zb or interleaved)", ErrPlan, s)
}

// solve runs the dynamic programme and returns up to keep solutions,
// best estimated step time (M-1)·T + CP first. Sequential mode: for every
// node count S whose least bottleneck T*(S) is below that of every smaller
// count, the partition with the least critical path among those with
// bottleneck T*(S). Graph mode also tries, for every such bottleneck bound,
// the least-critical-path solution on every node count, which finds
// shallow stage DAGs whose bottleneck is higher but whose fill and drain
// are shorter.
func solve(p *problem, M, keep int, graph bool) [][]segment {
	s := newSolver(p)
	s.minmax()
	type cand struct {
		segs []segment
		E    float64
		key  string
	}
	var cands []cand
	seen := map[string]bool{}
	add := func(segs []segment) float64 {
		T, CP := s.evaluate(segs)
		E := float64(M-1)*T + CP
		key := fmt.Sprint(segs)
		if !seen[key] {
			seen[key] = true
			cands = append(cands, cand{segs, E, key})
		}
		return E
	}
	var taus []float64
	for S := 1; S <= s.N; S++ {
		if t := s.g[S][0]; !math.IsInf(t, 1) {
			taus = append(taus, t)
		}
	}
	// Node counts whose bottleneck improves on every smaller count, most
	// nodes first; a count whose estimate cannot beat the keep-th best so
	// far is skipped (CP >= all work on the fastest node), which does not
	// change the result. With replicas the bottleneck improves at almost
	// every count: the least critical path of any solution on S nodes,
	// from one pass without a bound, skips more.
	var counts []int
	bestT := math.Inf(1)
	for S := 1; S <= s.N; S++ {
		if tau := s.g[S][0]; !math.IsInf(tau, 1) && tau < bestT {
			bestT = tau
			counts = append(counts, S)
		}
	}
	cpLow := p.c.work[p.c.U] / slices.Max(p.speed)
	var cpAny [][]float64
	if p.maxRep > 1 && len(counts) > keep {
		cpAny = s.minSum(math.Inf(1), s.N).cp
	}
	low := func(S int) float64 {
		if cpAny != nil {
			return float64(M-1)*s.g[S][0] + max(cpLow, cpAny[S][0])
		}
		return float64(M-1)*s.g[S][0] + cpLow
	}
	if cpAny != nil {
		// Most promising first, so that the bound skips more.
		slices.SortStableFunc(counts, func(a, b int) int { return cmp.Compare(low(b), low(a)) })
	}
	var top []float64
	for k := len(counts) - 1; k >= 0; k-- {
		S := counts[k]
		tau := s.g[S][0]
		if len(top) >= keep && low(S) >= top[keep-1] {
			continue
		}
		t := s.minSum(tau, S)
		if math.IsInf(t.cp[S][0], 1) {
			continue
		}
		top = append(top, add(s.walk(S, t)))
		slices.Sort(top)
	}
	if graph {
		slices.Sort(taus)
		taus = slices.Compact(taus)
		for _, tau := range taus {
			t := s.minSum(tau, s.N)
			for S := 1; S <= s.N; S++ {
				if !math.IsInf(t.cp[S][0], 1) {
					add(s.walk(S, t))
				}
			}
		}
	}
	sort.SliceStable(cands, func(a, b int) bool { return cands[a].E < cands[b].E })
	var out [][]segment
	for k := 0; k < len(cands) && k < keep; k++ {
		out = append(out, cands[k].segs)
	}
	return out
}

// segmentsPartition turns a solution into a partition, stages front to
// back (a region's branch stages in node order, then the join's).
func segmentsPartition(l *layout, p *problem, segs []segment, nodes []string) *Partition {
	part := &Partition{}
	for _, sg := range segs {
		if sg.r == nil {
			part.Stages = append(part.Stages, replicaPartStage(l, p, nodes, sg.i, sg.e, sg.c, sg.k))
			continue
		}
		G := 0
		for _, g := range sg.assign {
			G = max(G, g+1)
		}
		for g := 0; g < G; g++ {
			var idx []int
			if g == 0 {
				for u := sg.i; u < sg.r.start; u++ {
					for i := l.units[u][0]; i < l.units[u][1]; i++ {
						idx = append(idx, i)
					}
				}
			}
			for b, a := range sg.assign {
				if a == g {
					for _, u := range sg.r.branches[b] {
						for i := l.units[u][0]; i < l.units[u][1]; i++ {
							idx = append(idx, i)
						}
					}
				}
			}
			slices.Sort(idx)
			st := PartStage{Node: nodes[p.order[sg.c-1-g]]}
			for _, i := range idx {
				st.Layers = append(st.Layers, l.g.Nodes[i].Name)
			}
			part.Stages = append(part.Stages, st)
		}
	}
	return part
}

// uniformPartition gives each node, in the given order, an equal share of
// the units (the first U mod N nodes one more).
func uniformPartition(l *layout, nodes []string) *Partition {
	U := len(l.units)
	S := min(U, len(nodes))
	part := &Partition{}
	for k := 0; k < S; k++ {
		part.Stages = append(part.Stages, PartStage{Node: nodes[k], Layers: l.unitNames(k*U/S, (k+1)*U/S)})
	}
	return part
}

// paramsPartition cuts the units into one run per node, in the given
// order, minimising the largest run's parameter bytes (exact, O(U² N)).
func paramsPartition(l *layout, nodes []string) *Partition {
	U := len(l.units)
	S := min(U, len(nodes))
	w := make([]float64, U+1)
	for u, r := range l.units {
		w[u+1] = w[u]
		for i := r[0]; i < r[1]; i++ {
			w[u+1] += float64(l.prof.Layers[i].ParamBytes)
		}
	}
	cuts := minMaxCuts(w, S, nil)
	part := &Partition{}
	for k := 0; k < S; k++ {
		part.Stages = append(part.Stages, PartStage{Node: nodes[k], Layers: l.unitNames(cuts[k], cuts[k+1])})
	}
	return part
}

// minMaxCuts splits prefix sums w (U+1 entries) into S non-empty runs
// minimising the largest run, ties to the earliest cuts; it returns the
// S+1 boundaries. speed, if not nil, divides run k's sum (its node's
// speed).
func minMaxCuts(w []float64, S int, speed func(k int) float64) []int {
	U := len(w) - 1
	inf := math.Inf(1)
	f := make([][]float64, S+1)
	arg := make([][]int, S+1)
	for k := range f {
		f[k] = make([]float64, U+1)
		arg[k] = make([]int, U+1)
		for i := range f[k] {
			f[k][i] = inf
		}
	}
	f[0][0] = 0
	for k := 1; k <= S; k++ {
		sp := 1.0
		if speed != nil {
			sp = speed(k - 1)
		}
		for e := k; e <= U-(S-k); e++ {
			for i := e - 1; i >= k-1; i-- {
				v := max(f[k-1][i], (w[e]-w[i])/sp)
				if v <= f[k][e] {
					f[k][e], arg[k][e] = v, i
				}
			}
		}
	}
	cuts := make([]int, S+1)
	cuts[S] = U
	for k := S; k > 0; k-- {
		cuts[k-1] = arg[k][cuts[k]]
	}
	return cuts
}

func fmtBytes(b float64) string {
	switch {
	case b >= 1<<30:
		return fmt.Sprintf("%.2f GiB", b/(1<<30))
	case b >= 1<<20:
		return fmt.Sprintf("%.1f MiB", b/(1<<20))
	case b >= 1<<10:
		return fmt.Sprintf("%.1f KiB", b/(1<<10))
	}
	return fmt.Sprintf("%.0f B", b)
}

// inflightFor is how many of M micro-batches a stage holds at once under
// sched when it is c nodes from the end, counting its own (the last: 1):
// GPipe holds all of them, 1F1B and the graph schedule at most c.
func inflightFor(sched Schedule, M int) func(c int) float64 {
	if sched == GPipe {
		return func(c int) float64 { return float64(M) }
	}
	return func(c int) float64 { return float64(min(M, c)) }
}
