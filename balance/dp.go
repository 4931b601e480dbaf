package balance

import (
	"math"
	"slices"
	"sort"
)

// problem is one instance of the partitioning dynamic programme: a
// layout's costs at one micro-batch size, the nodes in canonical order
// (order[0] runs the last stage, order[1] the one before it, ...; a
// pipeline of S stages uses order[0..S)), and the number of micro-batches
// in flight on a stage as a function of its distance from the end.
//
// The cost model of a stage on node n covering units [i, e):
//
//	compute  C = work(i, e) / speed(n)            (forward + backward per micro-batch)
//	transfer X = max(act(i)/bw(prev→n) + lat, grad(i)/bw(n→prev) + lat)
//	memory     static(i, e) + inflight · (slot(i, e) + act(i)) <= memory(n)
//
// where act(i) and grad(i) are the bytes crossing the cut before unit i
// (zero at the model's start) and prev is the node of the stage before.
// A pipeline's bottleneck is T = max over stages of max(C, X): transfers
// occupy links, not the nodes' processors, so a stage's link and its
// processor work at the same time. The time of one micro-batch through
// the whole pipeline is CP = sum over stages of C + Xf + Xb.
type problem struct {
	c        *costs
	net      *network
	order    []int
	speed    []float64
	mem      []float64
	inflight func(fromEnd int) float64
	fly      []float64 // inflight(c) for c = 0..N
	// recompute lets a stage fit by recomputing its activations: one
	// micro-batch's layers' buffers, and inputs per micro-batch in flight.
	recompute bool
	// Graph mode: parallel regions by start unit (nil: sequential only).
	regionAt map[int]*region
	// Replicas (see allowReplicas): a chain stage may run on up to maxRep
	// consecutive nodes (1: one node) sharing M micro-batches, summing
	// their gradients in the chained order if chained; runs[c][k] prices
	// the k nodes ending at order[c-1].
	M, maxRep int
	chained   bool
	runs      [][]*run
	// inLink[c] and outLink[c] are the links from order[c] to order[c-1]
	// and back (c < N).
	inLink, outLink []LinkProfile
	// Scratch of the second pass's replicated stages.
	scratch endsScratch
}

// region is a fork-join part of a model between two cuts that only one
// tensor crosses: independent branches, then the join unit. A branch
// stage may also take the units [i, start) before the fork for any i >= lo
// (the chain since the previous region): the fork's producer then runs on
// that stage's node and sends the fork tensor to the other branches.
type region struct {
	lo, start, join int
	branches        [][]int // units of each branch, ascending
	work            []float64
	static          []float64
	slot            []float64
}

func newProblem(l *layout, c *costs, net *network, inflight func(int) float64, graph bool) *problem {
	p := &problem{c: c, net: net, order: net.sortedNodes(), inflight: inflight, maxRep: 1}
	for _, n := range p.order {
		p.speed = append(p.speed, net.nodes[n].Speed)
		p.mem = append(p.mem, net.memLimit(n))
	}
	for c := 0; c <= len(p.order); c++ {
		p.fly = append(p.fly, inflight(max(c, 1)))
	}
	p.inLink, p.outLink = make([]LinkProfile, len(p.order)), make([]LinkProfile, len(p.order))
	for c := 1; c < len(p.order); c++ {
		p.inLink[c], p.outLink[c] = net.link(p.order[c], p.order[c-1]), net.link(p.order[c-1], p.order[c])
	}
	if graph {
		p.regionAt = map[int]*region{}
		for _, r := range findRegions(l, c) {
			for i := r.lo; i <= r.start; i++ {
				p.regionAt[i] = r
			}
		}
	}
	return p
}

// findRegions returns the model's fork-join regions with at least two
// branches.
func findRegions(l *layout, c *costs) []*region {
	U := len(l.units)
	cuts := []int{0}
	for e := 1; e < U; e++ {
		if len(l.crossing[e]) == 1 {
			cuts = append(cuts, e)
		}
	}
	cuts = append(cuts, U)
	var out []*region
	for k := 0; k+1 < len(cuts); k++ {
		a, b := cuts[k], cuts[k+1]
		if b-a < 3 {
			continue
		}
		join := b - 1
		parent := make([]int, join-a)
		for i := range parent {
			parent[i] = i
		}
		var find func(int) int
		find = func(x int) int {
			for parent[x] != x {
				parent[x] = parent[parent[x]]
				x = parent[x]
			}
			return x
		}
		for u := a; u < join; u++ {
			for i := l.units[u][0]; i < l.units[u][1]; i++ {
				for _, in := range l.g.Nodes[i].Inputs {
					j, ok := l.nodePos[in]
					if !ok {
						continue
					}
					v := l.unit[j]
					if v >= a && v < join && v != u {
						parent[find(u-a)] = find(v - a)
					}
				}
			}
		}
		groups := map[int][]int{}
		var roots []int
		for u := a; u < join; u++ {
			r := find(u - a)
			if _, ok := groups[r]; !ok {
				roots = append(roots, r)
			}
			groups[r] = append(groups[r], u)
		}
		if len(roots) < 2 {
			continue
		}
		lo := 0
		if len(out) > 0 {
			lo = out[len(out)-1].join
		}
		r := &region{lo: lo, start: a, join: join}
		for _, root := range roots {
			br := groups[root]
			var w, st, sl float64
			for _, u := range br {
				w += c.work[u+1] - c.work[u]
				st += c.static[u+1] - c.static[u]
				sl += c.slot[u+1] - c.slot[u]
			}
			r.branches = append(r.branches, br)
			r.work = append(r.work, w)
			r.static = append(r.static, st)
			r.slot = append(r.slot, sl)
		}
		out = append(out, r)
	}
	return out
}

func (p *problem) comp(i, e, c int) float64 { return (p.c.work[e] - p.c.work[i]) / p.speed[c-1] }

// xin is the bottleneck term and xsum the critical-path term of the cut
// before unit i into a stage on order[c-1] from one on order[c].
func (p *problem) xin(i, c, node int) (x, sum float64) {
	if i == 0 { // the inputs, from the feeder
		if p.net.feeder < 0 {
			return 0, 0
		}
		f := p.net.transfer(p.net.feeder, node, p.c.act[0], flowInput)
		return f, f
	}
	if c >= len(p.order) {
		return math.Inf(1), math.Inf(1)
	}
	if node == p.order[c-1] {
		// The links of order[c-1], looked up once (as network.transfer
		// prices them: the nodes differ).
		in, out := &p.inLink[c], &p.outLink[c]
		f, b := 0.0, 0.0
		if a := p.c.act[i]; a > 0 {
			f = in.occupies(a, flowAct) + in.Latency
		}
		if g := p.c.grad[i]; g > 0 {
			b = out.occupies(g, flowGrad) + out.Latency
		}
		return max(f, b), f + b
	}
	prev := p.order[c]
	f := p.net.transfer(prev, node, p.c.act[i], flowAct)
	b := p.net.transfer(node, prev, p.c.grad[i], flowGrad)
	return max(f, b), f + b
}

func (p *problem) memOK(i, e, c int) bool {
	return p.fits(p.c.static[e]-p.c.static[i], p.c.slot[e]-p.c.slot[i], p.c.act[i], p.fly[c], p.mem[c-1])
}

// fits reports whether a stage with static bytes, slot bytes of buffers
// and in bytes of inputs per micro-batch, fly micro-batches in flight, fits
// in mem, keeping its activations or, if allowed, recomputing them.
func (p *problem) fits(static, slot, in, fly, mem float64) bool {
	return static+fly*(slot+in) <= mem || p.recompute && static+slot+max(fly, 1)*in <= mem
}

// segment is one step of a solution: a chain stage [i, e) on order[c-1]
// (and, with k > 1 replicas, on order[c-k..c-2] too), or a region's
// branches on order[c-1] ... order[c-G] (assign[b] is the offset of branch
// b's node: order[c-1-assign[b]]).
type segment struct {
	i, e, c, k int
	r          *region
	assign     []int
}

// parallel is a region's best branch-to-node assignment for c nodes from
// the end and G groups: its bottleneck and critical-path time, or
// ok = false if no assignment fits memory.
type parallel struct {
	ok       bool
	T, CP    float64
	assign   []int
	nextC, G int
}

// assignBranches places r's branches on the G nodes order[c-1..c-G],
// minimising the slowest node (exhaustively for up to 4096 assignments,
// else longest branch first onto the node that finishes it soonest).
func (p *problem) assignBranches(r *region, i, c, G int) parallel {
	k := len(r.branches)
	res := parallel{T: math.Inf(1), G: G, nextC: c - G}
	xs, xsum := p.branchTransfers(r, i, c, G)
	eval := func(assign []int) (float64, float64, bool) {
		w := make([]float64, G)
		st := make([]float64, G)
		sl := make([]float64, G)
		// The prefix [i, start) runs on the first group's node.
		w[0] = p.c.work[r.start] - p.c.work[i]
		st[0] = p.c.static[r.start] - p.c.static[i]
		sl[0] = p.c.slot[r.start] - p.c.slot[i]
		used := make([]bool, G)
		for b, g := range assign {
			w[g] += r.work[b]
			st[g] += r.static[b]
			sl[g] += r.slot[b]
			used[g] = true
		}
		T, CP := 0.0, 0.0
		for g := 0; g < G; g++ {
			if !used[g] {
				return 0, 0, false
			}
			in := p.c.act[r.start]
			if g == 0 {
				in = p.c.act[i]
			}
			if !p.fits(st[g], sl[g], in, p.inflight(c), p.mem[c-1-g]) {
				return 0, 0, false
			}
			t := w[g] / p.speed[c-1-g]
			T = max(T, t, xs[g])
			CP = max(CP, t+xsum[g])
		}
		return T, CP, true
	}
	total := math.Pow(float64(G), float64(k))
	if total <= 4096 {
		assign := make([]int, k)
		for {
			if T, CP, ok := eval(assign); ok && T < res.T {
				res = parallel{ok: true, T: T, CP: CP, assign: slices.Clone(assign), G: G, nextC: c - G}
			}
			b := 0
			for b < k {
				assign[b]++
				if assign[b] < G {
					break
				}
				assign[b] = 0
				b++
			}
			if b == k {
				break
			}
		}
		return res
	}
	idx := make([]int, k)
	for b := range idx {
		idx[b] = b
	}
	sort.SliceStable(idx, func(a, b int) bool { return r.work[idx[a]] > r.work[idx[b]] })
	assign := make([]int, k)
	load := make([]float64, G)
	load[0] = p.c.work[r.start] - p.c.work[i]
	for n, b := range idx {
		best := 0
		if n < G {
			best = n // every node gets a branch
		} else {
			for g := 1; g < G; g++ {
				if (load[g]+r.work[b])/p.speed[c-1-g] < (load[best]+r.work[b])/p.speed[c-1-best] {
					best = g
				}
			}
		}
		assign[b] = best
		load[best] += r.work[b]
	}
	if T, CP, ok := eval(assign); ok {
		res = parallel{ok: true, T: T, CP: CP, assign: assign, G: G, nextC: c - G}
	}
	return res
}

// solver holds the tables of both passes.
type solver struct {
	p *problem
	N int
	U int
	// g[c][i]: least bottleneck for units [i, U) on order[c-1..0].
	g [][]float64
	// par caches region assignments by (start unit, c, G).
	par map[[3]int]parallel
}

func newSolver(p *problem) *solver {
	s := &solver{p: p, N: len(p.order), U: p.c.U, par: map[[3]int]parallel{}}
	return s
}

func (s *solver) parallelOptions(i, c int) []parallel {
	r := s.p.regionAt[i]
	if r == nil {
		return nil
	}
	var out []parallel
	for G := 2; G <= len(r.branches) && G <= c-1; G++ {
		key := [3]int{i, c, G}
		v, ok := s.par[key]
		if !ok {
			v = s.p.assignBranches(r, i, c, G)
			s.par[key] = v
		}
		if v.ok {
			out = append(out, v)
		}
	}
	return out
}

// minmax runs the first pass: the least bottleneck for every start unit
// and node count. O(U² N) in the worst case; the loop over stage ends
// stops as soon as a stage alone is slower than the best found, so a
// balanced instance costs about O(U² log N).
func (s *solver) minmax() {
	p, N, U := s.p, s.N, s.U
	inf := math.Inf(1)
	s.g = make([][]float64, N+1)
	for c := range s.g {
		s.g[c] = make([]float64, U+1)
		for i := range s.g[c] {
			s.g[c][i] = inf
		}
	}
	s.g[0][U] = 0
	for c := 1; c <= N; c++ {
		node := p.order[c-1]
		for i := U - 1; i >= 0; i-- {
			if i > 0 && c == N {
				continue
			}
			x, _ := p.xin(i, c, node)
			best := inf
			last := U - (c - 1)
			if p.maxRep > 1 && c > 1 {
				last = U - 1 // the other nodes may all be replicas of one stage
			}
			first := i + 1
			if c == 1 {
				first = U
			}
			for e := first; e <= last; e++ {
				comp := p.comp(i, e, c)
				if comp >= best || !p.memOK(i, e, c) {
					break
				}
				if v := max(comp, x, s.g[c-1][e]); v < best {
					best = v
				}
			}
			for _, o := range s.parallelOptions(i, c) {
				if v := max(o.T, s.g[o.nextC][s.p.regionAt[i].join]); v < best {
					best = v
				}
			}
			for k := 2; k <= min(c, p.maxRep); k++ {
				rn := p.rep(c, k)
				if rn == nil {
					break
				}
				x, _ := p.rxin(i, c, rn)
				first, last := i+1, U-1
				if c == k {
					first, last = U, U
				}
				for e := first; e <= last; e++ {
					comp := p.rcomp(i, e, rn)
					if comp >= best || !p.rmemOK(i, e, c, rn) {
						break
					}
					if v := max(comp, x, s.g[c-k][e]); v < best {
						best = v
					}
				}
			}
			s.g[c][i] = best
		}
	}
}

// sumTable is the second pass's result: cp[c][i] is the least critical
// path of units [i, U) on order[c-1..0] within the bound, reached by a
// chain stage [i, choice[c][i]) on reps[c][i] nodes, or (choice -G) a
// region's branches on G nodes, par[{c, i}].
type sumTable struct {
	cp           [][]float64
	choice, reps [][]int
	par          map[[2]int]parallel
}

// minSum runs the second pass for bottleneck bound tau and node counts up
// to cmax: the least critical-path time of a solution whose every stage
// is within tau, and the solution.
func (s *solver) minSum(tau float64, cmax int) *sumTable {
	p, U := s.p, s.U
	inf := math.Inf(1)
	t := &sumTable{cp: make([][]float64, cmax+1), choice: make([][]int, cmax+1), reps: make([][]int, cmax+1), par: map[[2]int]parallel{}}
	h := t.cp
	for c := range h {
		h[c] = make([]float64, U+1)
		t.choice[c] = make([]int, U+1)
		t.reps[c] = make([]int, U+1)
		for i := range h[c] {
			h[c][i] = inf
		}
	}
	h[0][U] = 0
	// No chain stage can end before lowE[c']: the rest, on c' nodes, would
	// not fit tau.
	lowE := make([]int, cmax+1)
	for c := range lowE {
		lowE[c] = U
		for e := 0; e <= U; e++ {
			if s.g[c][e] <= tau {
				lowE[c] = e
				break
			}
		}
	}
	for c := 1; c <= cmax; c++ {
		node := p.order[c-1]
		// ends[k][i]: the best end of a stage from unit i on k replicas.
		ends := p.scratch.rows(min(c, p.maxRep)+1, U)
		for k := 2; k < len(ends); k++ {
			if rn := p.rep(c, k); rn != nil {
				p.replicaEnds(c, k, rn, tau, h[c-k], lowE[c-k], ends[k])
			} else {
				ends[k] = nil
			}
		}
		for i := U - 1; i >= 0; i-- {
			if i > 0 && c == s.N {
				continue
			}
			if s.g[c][i] > tau {
				continue // no solution within tau
			}
			x, xs := p.xin(i, c, node)
			best, arg, reps := inf, -1, 1
			if x <= tau {
				last := U - (c - 1)
				if p.maxRep > 1 && c > 1 {
					last = U - 1
				}
				first := max(i+1, lowE[c-1])
				if c == 1 {
					first = U
				}
				for e := first; e <= last; e++ {
					comp := p.comp(i, e, c)
					if comp > tau || !p.memOK(i, e, c) {
						break
					}
					rest := h[c-1][e]
					if rest == inf {
						continue
					}
					if v := comp + xs + rest; v < best {
						best, arg = v, e
					}
				}
			}
			for _, o := range s.parallelOptions(i, c) {
				rest := h[o.nextC][p.regionAt[i].join]
				if o.T > tau || rest == inf {
					continue
				}
				if v := o.CP + rest; v < best {
					best, arg, reps = v, -o.G, 1
					t.par[[2]int{c, i}] = o
				}
			}
			for k := 2; k < len(ends); k++ {
				e := -1
				if ends[k] != nil {
					e = ends[k][i]
				}
				if e < 0 {
					continue
				}
				x, xs := p.rxin(i, c, p.rep(c, k))
				if x > tau {
					continue
				}
				if v := p.comp(i, e, c) + xs + h[c-k][e]; v < best {
					best, arg, reps = v, e, k
				}
			}
			h[c][i], t.choice[c][i], t.reps[c][i] = best, arg, reps
		}
	}
	return t
}

// walk reconstructs the solution for S nodes from the second pass.
func (s *solver) walk(S int, t *sumTable) []segment {
	var segs []segment
	i, c := 0, S
	for i < s.U {
		a := t.choice[c][i]
		if a > 0 {
			k := t.reps[c][i]
			segs = append(segs, segment{i: i, e: a, c: c, k: k})
			i, c = a, c-k
			continue
		}
		o := t.par[[2]int{c, i}]
		r := s.p.regionAt[i]
		segs = append(segs, segment{i: i, e: r.join, c: c, k: 1, r: r, assign: o.assign})
		i, c = r.join, o.nextC
	}
	return segs
}

// bottleneck and criticalPath evaluate a solution by the cost model.
func (s *solver) evaluate(segs []segment) (T, CP float64) {
	p := s.p
	for _, sg := range segs {
		if sg.r == nil {
			t, cp, _ := p.stage(sg.i, sg.e, sg.c, max(sg.k, 1))
			T = max(T, t)
			CP += cp
			continue
		}
		G := 0
		for _, g := range sg.assign {
			G = max(G, g+1)
		}
		o := p.assignBranchesFixed(sg.r, sg.i, sg.c, G, sg.assign)
		T = max(T, o.T)
		CP += o.CP
	}
	return T, CP
}

func (p *problem) assignBranchesFixed(r *region, i, c, G int, assign []int) parallel {
	T, CP := 0.0, 0.0
	w := make([]float64, G)
	w[0] = p.c.work[r.start] - p.c.work[i]
	for b, g := range assign {
		w[g] += r.work[b]
	}
	xs, xsum := p.branchTransfers(r, i, c, G)
	for g := 0; g < G; g++ {
		t := w[g] / p.speed[c-1-g]
		T = max(T, t, xs[g])
		CP = max(CP, t+xsum[g])
	}
	return parallel{ok: true, T: T, CP: CP, assign: assign, G: G, nextC: c - G}
}

// branchTransfers are the input transfers of a region's G branch stages
// when the first also runs the prefix [i, start): it receives cut i from
// the stage before, the others receive the fork tensor from it (or, with
// no prefix, from the stage before).
func (p *problem) branchTransfers(r *region, i, c, G int) (xs, xsum []float64) {
	xs, xsum = make([]float64, G), make([]float64, G)
	xs[0], xsum[0] = p.xin(i, c, p.order[c-1])
	for g := 1; g < G; g++ {
		if i == r.start {
			xs[g], xsum[g] = p.xin(r.start, c, p.order[c-1-g])
			continue
		}
		src, dst := p.order[c-1], p.order[c-1-g]
		f := p.net.transfer(src, dst, p.c.act[r.start], flowAct)
		b := p.net.transfer(dst, src, p.c.grad[r.start], flowGrad)
		xs[g], xsum[g] = max(f, b), f+b
	}
	return xs, xsum
}
