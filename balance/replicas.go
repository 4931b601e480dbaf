package balance

import (
	"math"
	"slices"
)

// run is k >= 2 consecutive nodes of the canonical order serving one
// stage as its replicas: replica r on order[c-1-r] with shares[r] of the M
// micro-batches. Its fields price a stage [i, e) on it, per the cost model
// of problem extended to replicas:
//
//	compute  C = (work(i, e)·phi + train(i, e)·sumA + sumB) / M
//	         C = (fwd(i, e)·phi + back(i, e)·phiSum + train(i, e)·sumA + sumB) / M   (chained sums)
//	transfer X = max(act(i)·fA + fL, grad(i)·bA + bL)
//	memory     static(i, e) + train(i, e) + fly_r·(slot(i, e) + act(i)) <= memory(node_r) for every r
//
// C is the stage's time per step spread over its micro-batches: the
// slowest replica's share of the work, phi = max over r of
// shares[r]/speed_r, plus the gradient sum (the chain r -> r+1 and the
// last replica's total to every other, each carrying train(i, e) bytes).
// With chained sums the replicas run their backward passes one after the
// other, phiSum = the sum over r of shares[r]/speed_r.
// X bounds the busiest input link, a replica receiving its shares[r]
// micro-batches (from the node order[c], or the feeder at cut 0); fly_r
// is the schedule's micro-batches in flight, at most shares[r]. For the
// critical path a micro-batch crosses the stage on its slowest replica,
// order[c-1], and the slowest links. The sum and link terms are upper
// bounds (each term's largest coefficient over the replicas), so that a
// run prices a stage in O(1) (memory in O(k) where a node has a limit).
type run struct {
	shares      []int
	phi, phiSum float64
	// The gradient sum's time is train·sumA + sumB.
	sumA, sumB float64
	// Bottleneck and critical-path coefficients of the input links from
	// order[c] (cut i > 0) and from the feeder (cut 0): per byte (A) and
	// fixed (L), activations forward (f) and gradients back (b).
	fA, fL, bA, bL     float64
	cfA, cfL, cbA, cbL float64
	iA, iL, ciA, ciL   float64
	fly                []float64 // per replica, micro-batches in flight
	memMin             float64   // the least memory of the run's nodes
}

// allowReplicas lets a stage run on up to maxRep consecutive nodes of the
// canonical order sharing M micro-batches, summing their gradients in the
// chained order if chained, and prices every such run.
func (p *problem) allowReplicas(M, maxRep int, chained bool) {
	N := len(p.order)
	p.M, p.maxRep, p.chained = M, maxRep, chained
	p.runs = make([][]*run, N+1)
	for c := 2; c <= N; c++ {
		p.runs[c] = make([]*run, min(c, maxRep, M)+1)
		for k := 2; k < len(p.runs[c]); k++ {
			p.runs[c][k] = p.newRun(c, k)
		}
	}
}

// rep returns the run of k nodes ending at order[c-1], or nil.
func (p *problem) rep(c, k int) *run {
	if c >= len(p.runs) || k >= len(p.runs[c]) {
		return nil
	}
	return p.runs[c][k]
}

// shareOut splits M micro-batches among nodes of the given speeds to
// minimise the slowest one's time, max shares[r]/speed[r], with one for
// each at least: the rest go one by one to the node that would finish its
// next soonest (the earlier node on ties), which is optimal for equal
// micro-batches.
func shareOut(M int, speed []float64) []int {
	sh := make([]int, len(speed))
	for r := range sh {
		sh[r] = 1
	}
	for m := len(speed); m < M; m++ {
		best := 0
		for r := 1; r < len(sh); r++ {
			if float64(sh[r]+1)/speed[r] < float64(sh[best]+1)/speed[best] {
				best = r
			}
		}
		sh[best]++
	}
	return sh
}

// perByte is a link's time per raw byte of f.
func perByte(l LinkProfile, f flow) float64 {
	if w := l.cost(f); w != nil {
		return w.Seconds + w.Ratio/l.Bandwidth
	}
	return 1 / l.Bandwidth
}

func (p *problem) newRun(c, k int) *run {
	N, M := len(p.order), float64(p.M)
	node := make([]int, k)
	speed := make([]float64, k)
	for r := range node {
		node[r] = p.order[c-1-r]
		speed[r] = p.speed[c-1-r]
	}
	rn := &run{shares: shareOut(p.M, speed), memMin: math.Inf(1)}
	for r, n := range rn.shares {
		rn.phi = max(rn.phi, float64(n)/speed[r])
		rn.phiSum += float64(n) / speed[r]
		rn.fly = append(rn.fly, min(float64(n), p.inflight(c)))
		rn.memMin = min(rn.memMin, p.mem[c-1-r])
		share := float64(n) / M
		if c < N {
			prev := p.order[c]
			f, b := p.net.link(prev, node[r]), p.net.link(node[r], prev)
			af, ab := perByte(f, flowAct), perByte(b, flowGrad)
			rn.fA, rn.fL = max(rn.fA, share*af), max(rn.fL, share*f.Latency)
			rn.bA, rn.bL = max(rn.bA, share*ab), max(rn.bL, share*b.Latency)
			rn.cfA, rn.cfL = max(rn.cfA, af), max(rn.cfL, f.Latency)
			rn.cbA, rn.cbL = max(rn.cbA, ab), max(rn.cbL, b.Latency)
		}
		if p.net.feeder >= 0 && p.net.feeder != node[r] {
			l := p.net.link(p.net.feeder, node[r])
			a := perByte(l, flowInput)
			rn.iA, rn.iL = max(rn.iA, share*a), max(rn.iL, share*l.Latency)
			rn.ciA, rn.ciL = max(rn.ciA, a), max(rn.ciL, l.Latency)
		}
	}
	var bcA, bcL float64 // the last replica's total to the others: the slowest link
	for r := 0; r+1 < k; r++ {
		l := p.net.link(node[r], node[r+1])
		rn.sumA += perByte(l, flowGrad)
		rn.sumB += l.Latency
		l = p.net.link(node[k-1], node[r])
		bcA, bcL = max(bcA, perByte(l, flowGrad)), max(bcL, l.Latency)
	}
	rn.sumA += bcA
	rn.sumB += bcL
	return rn
}

// rcomp is the bottleneck compute term C of stage [i, e) on run rn.
func (p *problem) rcomp(i, e int, rn *run) float64 {
	w := (p.c.work[e] - p.c.work[i]) * rn.phi
	if p.chained {
		b := p.c.back[e] - p.c.back[i]
		w = (p.c.work[e]-p.c.work[i]-b)*rn.phi + b*rn.phiSum
	}
	if t := p.c.train[e] - p.c.train[i]; t > 0 {
		w += t*rn.sumA + rn.sumB
	}
	return w / float64(p.M)
}

// rxin is the bottleneck term X and the critical-path transfer term of
// the cut before unit i into a stage on run rn of c nodes.
func (p *problem) rxin(i, c int, rn *run) (x, sum float64) {
	term := func(bytes, a, l float64) float64 {
		if bytes <= 0 {
			return 0
		}
		return bytes*a + l
	}
	if i == 0 {
		a := p.c.act[0]
		return term(a, rn.iA, rn.iL), term(a, rn.ciA, rn.ciL)
	}
	if c >= len(p.order) {
		return math.Inf(1), math.Inf(1)
	}
	a, g := p.c.act[i], p.c.grad[i]
	return max(term(a, rn.fA, rn.fL), term(g, rn.bA, rn.bL)), term(a, rn.cfA, rn.cfL) + term(g, rn.cbA, rn.cbL)
}

// rmemOK reports whether stage [i, e) fits every node of run rn, which
// ends at order[c-1], and may have replicas: each replica would update
// running statistics (BatchNorm's) from its own micro-batches only.
func (p *problem) rmemOK(i, e, c int, rn *run) bool {
	if p.c.buffers[e] > p.c.buffers[i] {
		return false
	}
	if math.IsInf(rn.memMin, 1) {
		return true
	}
	static := p.c.static[e] - p.c.static[i] + p.c.train[e] - p.c.train[i]
	per := p.c.slot[e] - p.c.slot[i] + p.c.act[i]
	for r, f := range rn.fly {
		if static+f*per > p.mem[c-1-r] {
			return false
		}
	}
	return true
}

// stage prices stage [i, e) on the k nodes ending at order[c-1] (k = 1:
// one node): its bottleneck term, its critical-path term, and whether it
// fits their memory and the run exists.
func (p *problem) stage(i, e, c, k int) (T, cp float64, ok bool) {
	comp := p.comp(i, e, c)
	if k == 1 {
		x, xs := p.xin(i, c, p.order[c-1])
		return max(comp, x), comp + xs, p.memOK(i, e, c)
	}
	rn := p.rep(c, k)
	if rn == nil {
		return 0, 0, false
	}
	x, xs := p.rxin(i, c, rn)
	return max(p.rcomp(i, e, rn), x), comp + xs, p.rmemOK(i, e, c, rn)
}

// replicaPartStage is the partition stage of units [i, e) on the k nodes
// ending at order[c-1]: shares only where they differ from the equal
// split.
func replicaPartStage(l *layout, p *problem, nodes []string, i, e, c, k int) PartStage {
	st := PartStage{Node: nodes[p.order[c-1]], Layers: l.unitNames(i, e)}
	if k < 2 {
		return st
	}
	for r := 1; r < k; r++ {
		st.Replicas = append(st.Replicas, nodes[p.order[c-1-r]])
	}
	if sh := p.rep(c, k).shares; !slices.Equal(sh, equalSplit(p.M, k)) {
		st.Shares = slices.Clone(sh)
	}
	return st
}

// replicaEnds finds, for every first unit i, the end e of the stage [i, e)
// on run rn (the k nodes ending at order[c-1]) with the least critical
// path comp(i, e, c) + rest[e] (rest: h[c-k], the second pass's row),
// among the ends within bound tau that leave a feasible rest (e >=
// lowE); -1 where there is none; ties to the earliest end. comp is
// work[e]/speed - work[i]/speed, so the best end is the minimum of one
// array over a window that moves down with i at both ends: a monotone
// queue finds it in O(U) for all i. Memory bounds e too, but not
// monotonically in i (the cut's activations count); a window minimum that
// does not fit is searched again among the ends that do. The ends are
// written to out (U entries).
func (p *problem) replicaEnds(c, k int, rn *run, tau float64, rest []float64, lowE int, out []int) {
	U := p.c.U
	for i := range out {
		out[i] = -1
	}
	fits := func(i, e int) bool { return p.rcomp(i, e, rn) <= tau && p.rmemOK(i, e, c, rn) }
	if c == k { // the last stage: all remaining units
		for i := range out {
			if !math.IsInf(rest[U], 1) && fits(i, U) {
				out[i] = U
			}
		}
		return
	}
	sp := p.speed[c-1]
	av := p.scratch.values(U + 1)
	for e := max(lowE, 1); e < U; e++ {
		av[e] = p.c.work[e]/sp + rest[e]
	}
	a := func(e int) float64 { return av[e] }
	q := p.scratch.queue[:0] // window indices, oldest (largest) first, values increasing
	defer func() { p.scratch.queue = q }()
	head := 0
	hi, next := U-1, U-1
	for i := U - 1; i >= 0; i-- {
		lo := max(i+1, lowE)
		for hi >= lo && p.rcomp(i, hi, rn) > tau {
			hi--
		}
		for ; next >= lo; next-- {
			if next > hi {
				continue
			}
			for len(q) > head && a(q[len(q)-1]) >= a(next) {
				q = q[:len(q)-1]
			}
			q = append(q, next)
		}
		for len(q) > head && q[head] > hi {
			head++
		}
		if len(q) == head || math.IsInf(a(q[head]), 1) {
			continue
		}
		if e := q[head]; p.rmemOK(i, e, c, rn) {
			out[i] = e
			continue
		}
		best := math.Inf(1)
		for e := lo; e <= hi && p.rmemOK(i, e, c, rn); e++ {
			if v := a(e); v < best {
				best, out[i] = v, e
			}
		}
	}
}

// endsScratch is memory the second pass reuses from row to row.
type endsScratch struct {
	ends  [][]int
	av    []float64
	queue []int
}

// rows returns n rows of u ints.
func (s *endsScratch) rows(n, u int) [][]int {
	for len(s.ends) < n {
		s.ends = append(s.ends, nil)
	}
	for k := range s.ends[:n] {
		if len(s.ends[k]) != u {
			s.ends[k] = make([]int, u)
		}
	}
	return s.ends[:n]
}

func (s *endsScratch) values(n int) []float64 {
	if len(s.av) < n {
		s.av = make([]float64, n)
	}
	return s.av[:n]
}
