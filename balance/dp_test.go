package balance

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/ppnode/ppnode/nn"
)

// randomInstance builds a chain of L layers with a random profile and a
// random cluster of up to maxN nodes: speeds, memory limits (some
// unlimited) and per-pair link speeds.
func randomInstance(r *rand.Rand, graphs map[int]*nn.Graph, maxN int, t *testing.T) (*layout, *network, int, Schedule, int) {
	L := 1 + r.IntN(12)
	g := graphs[L]
	if g == nil {
		g = chainModel(t, L)
		graphs[L] = g
	}
	prof := Analytic(g, AnalyticOptions{})
	for k := range prof.Layers {
		lp := &prof.Layers[k]
		lp.Forward = Timing{Fixed: r.Float64() * 1e-3, PerSample: r.Float64() * 1e-2}
		lp.Backward = Timing{Fixed: r.Float64() * 1e-3, PerSample: r.Float64() * 2e-2}
		lp.OutputBytes = int64(r.IntN(100000))
		lp.ParamBytes = int64(r.IntN(1 << 20))
		lp.TrainableBytes = lp.ParamBytes
		lp.SlotBytes = float64(r.IntN(50000))
	}
	N := 1 + r.IntN(maxN)
	c := &Cluster{DefaultLink: LinkProfile{Bandwidth: 1e6 + r.Float64()*1e8, Latency: r.Float64() * 1e-3}}
	for i := 0; i < N; i++ {
		n := NodeProfile{Name: fmt.Sprintf("n%d", i), Speed: 0.2 + 1.8*r.Float64()}
		if r.IntN(3) > 0 {
			n.Memory = int64(1<<20) + int64(r.IntN(6<<20))
		}
		c.Nodes = append(c.Nodes, n)
	}
	for i := 0; i < N; i++ {
		for j := 0; j < N; j++ {
			if i != j && r.IntN(2) == 0 {
				c.Links = append(c.Links, LinkProfile{From: c.Nodes[i].Name, To: c.Nodes[j].Name, Bandwidth: 1e6 + r.Float64()*1e8, Latency: r.Float64() * 1e-3})
			}
		}
	}
	net, err := c.resolve(prof)
	if err != nil {
		t.Fatal(err)
	}
	return newLayout(g, prof), net, 1 + r.IntN(8), Schedule(r.IntN(2)), 1 + r.IntN(4)
}

// bruteForce enumerates every split of the units into S runs, stage k of
// the pipeline on order[S-1-k], and returns the least bottleneck and,
// among the splits within tau, the least critical path (summed from the
// back, as the programme sums).
func bruteForce(p *problem, S int, tau float64) (bestT, bestCP float64) {
	U := p.c.U
	bestT, bestCP = math.Inf(1), math.Inf(1)
	cuts := make([]int, S+1)
	cuts[S] = U
	var rec func(k, from int)
	rec = func(k, from int) {
		if k == S {
			T, CP, ok := 0.0, 0.0, true
			for j := S - 1; j >= 0; j-- {
				c := S - j
				i, e := cuts[j], cuts[j+1]
				if !p.memOK(i, e, c) {
					ok = false
					break
				}
				x, xs := p.xin(i, c, p.order[c-1])
				comp := p.comp(i, e, c)
				T = max(T, comp, x)
				CP = comp + xs + CP
			}
			if !ok {
				return
			}
			bestT = min(bestT, T)
			if T <= tau {
				bestCP = min(bestCP, CP)
			}
			return
		}
		for e := from + 1; e <= U-(S-k-1); e++ {
			if k == S-1 && e != U {
				continue
			}
			cuts[k+1] = e
			rec(k+1, e)
		}
	}
	cuts[0] = 0
	rec(0, 0)
	return bestT, bestCP
}

// The balanced partitioner's programme against brute force on 1000 seeded
// random instances (up to 12 layers, 4 nodes, random speeds, sizes, links
// and memory limits): for every node count, the first pass finds the least
// bottleneck and the second the least critical path within it, and the
// solution it returns has exactly those costs.
func TestBalancedMatchesBruteForce(t *testing.T) {
	r := rand.New(rand.NewPCG(4, 2))
	graphs := map[int]*nn.Graph{}
	checked, feasible := 0, 0
	for inst := 0; inst < 1000; inst++ {
		l, net, M, sched, b := randomInstance(r, graphs, 4, t)
		p := newProblem(l, l.costsFor(b, 1), net, inflightFor(sched, M), false)
		s := newSolver(p)
		s.minmax()
		for S := 1; S <= min(s.N, p.c.U); S++ {
			checked++
			segs, ok := checkOracle(t, inst, S, s, bruteForce)
			if !ok {
				continue
			}
			feasible++
			if len(segs) != S {
				t.Fatalf("instance %d, S=%d: solution %v has %d stages", inst, S, segs, len(segs))
			}
		}
	}
	t.Logf("%d (instance, node count) pairs, %d feasible", checked, feasible)
	if feasible < checked/3 {
		t.Fatalf("only %d of %d cases feasible: the memory limits are too tight to test much", feasible, checked)
	}
}

// bruteForceReplicas is bruteForce with replicated stages: every split of
// the units into stages, front to back, and of the S nodes into runs of
// consecutive nodes, one run per stage (the last stage on order[0..]).
func bruteForceReplicas(p *problem, S int, tau float64) (bestT, bestCP float64) {
	U := p.c.U
	bestT, bestCP = math.Inf(1), math.Inf(1)
	// rec prices units [i, U) on nodes order[c-1..0]: every (T, CP).
	var rec func(i, c int, f func(T, CP float64))
	rec = func(i, c int, f func(T, CP float64)) {
		if i == U || c == 0 {
			if i == U && c == 0 {
				f(0, 0)
			}
			return
		}
		for k := 1; k <= c; k++ {
			for e := i + 1; e <= U; e++ {
				T, cp, ok := p.stage(i, e, c, k)
				if !ok {
					continue
				}
				rec(e, c-k, func(t, CP float64) { f(max(T, t), cp+CP) })
			}
		}
	}
	rec(0, S, func(T, CP float64) {
		bestT = min(bestT, T)
		if T <= tau {
			bestCP = min(bestCP, CP)
		}
	})
	return bestT, bestCP
}

// The programme with replicated stages against brute force on 600 seeded
// random instances (up to 8 layers, 6 nodes, random speeds, sizes, links,
// codecs, feeders, memory limits and micro-batch counts): for every node
// count the least
// bottleneck, the least critical path within it, and a solution with
// exactly those costs.
func TestReplicatedMatchesBruteForce(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 3))
	graphs := map[int]*nn.Graph{}
	checked, feasible, replicated := 0, 0, 0
	for inst := 0; inst < 600; inst++ {
		l, net, M, sched, b := randomInstance(r, graphs, 6, t)
		if len(l.units) > 8 {
			continue
		}
		// A feeder and codecs, sometimes.
		if r.IntN(2) == 0 {
			net.feeder = r.IntN(len(net.nodes))
		}
		if r.IntN(2) == 0 {
			net.def.Act = &WireCost{Ratio: 0.5 + r.Float64(), Seconds: 1e-9 * r.Float64()}
			net.def.Grad = &WireCost{Ratio: 0.5 + r.Float64(), Seconds: 1e-9 * r.Float64()}
			net.def.Input = &WireCost{Ratio: 0.5 + r.Float64(), Seconds: 1e-9 * r.Float64()}
		}
		p := newProblem(l, l.costsFor(b, 1), net, inflightFor(sched, M), false)
		p.allowReplicas(M, len(p.order), r.IntN(2) == 0)
		s := newSolver(p)
		s.minmax()
		for S := 1; S <= s.N; S++ {
			checked++
			segs, ok := checkOracle(t, inst, S, s, bruteForceReplicas)
			if !ok {
				continue
			}
			feasible++
			used := 0
			for _, sg := range segs {
				used += sg.k
				if sg.k > 1 {
					replicated++
				}
			}
			if used != S {
				t.Fatalf("instance %d, S=%d: solution %v uses %d nodes", inst, S, segs, used)
			}
		}
	}
	t.Logf("%d (instance, node count) pairs, %d feasible, %d replicated stages in the solutions", checked, feasible, replicated)
	if feasible < checked/3 || replicated < 100 {
		t.Fatalf("only %d of %d cases feasible, %d replicated stages: too little tested", feasible, checked, replicated)
	}
}

// shareOut's split minimises the slowest replica's time among all splits
// that give every replica a micro-batch.
func TestShareOutIsOptimal(t *testing.T) {
	r := rand.New(rand.NewPCG(2, 2))
	for trial := 0; trial < 2000; trial++ {
		k := 2 + r.IntN(3)
		M := k + r.IntN(7)
		speed := make([]float64, k)
		for i := range speed {
			speed[i] = 0.1 + 2*r.Float64()
			if r.IntN(3) == 0 && i > 0 {
				speed[i] = speed[i-1]
			}
		}
		cost := func(sh []int) float64 {
			c := 0.0
			for i, n := range sh {
				c = max(c, float64(n)/speed[i])
			}
			return c
		}
		best := math.Inf(1)
		sh := make([]int, k)
		var rec func(i, left int)
		rec = func(i, left int) {
			if i == k-1 {
				sh[i] = left
				best = min(best, cost(sh))
				return
			}
			for n := 1; n <= left-(k-1-i); n++ {
				sh[i] = n
				rec(i+1, left-n)
			}
		}
		rec(0, M)
		got := shareOut(M, speed)
		sum := 0
		for _, n := range got {
			sum += n
			if n < 1 {
				t.Fatalf("speeds %v, M=%d: share %v", speed, M, got)
			}
		}
		if sum != M || cost(got) != best {
			t.Fatalf("speeds %v, M=%d: shares %v cost %v, best %v", speed, M, got, cost(got), best)
		}
	}
}

// checkOracle compares the programme's S-node solution with brute force:
// the same bottleneck, then (if feasible) the same critical path, and a
// solution that reaches both. ok is false when no S-node plan fits.
func checkOracle(t *testing.T, inst, S int, s *solver, brute func(*problem, int, float64) (float64, float64)) (segs []segment, ok bool) {
	t.Helper()
	bt, _ := brute(s.p, S, math.Inf(1))
	if got := s.g[S][0]; got != bt {
		t.Fatalf("instance %d, S=%d: programme's bottleneck %v, brute force %v", inst, S, got, bt)
	}
	if math.IsInf(bt, 1) {
		return nil, false
	}
	_, bcp := brute(s.p, S, bt)
	tab := s.minSum(bt, S)
	if math.Abs(tab.cp[S][0]-bcp) > 1e-12*bcp {
		t.Fatalf("instance %d, S=%d: critical path %v, brute force %v", inst, S, tab.cp[S][0], bcp)
	}
	segs = s.walk(S, tab)
	if T, CP := s.evaluate(segs); T > bt || math.Abs(CP-bcp) > 1e-9*bcp {
		t.Fatalf("instance %d, S=%d: solution %v has T=%v CP=%v, want T<=%v CP=%v", inst, S, segs, T, CP, bt, bcp)
	}
	return segs, true
}
