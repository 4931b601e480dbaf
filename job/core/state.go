package core

import (
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/ppnode/ppnode/balance"
	"github.com/ppnode/ppnode/job"
)

// The core's state, grouped by what it is about. Each fact is kept once:
// what the status reports of a group is read from it (see Core.Status).

// planState is the job's plan and the stages that run it.
type planState struct {
	// The plan (nil until the first), its simulated report and
	// description, and the cluster it was made for.
	*balance.Plan
	report *balance.Report
	text   string
	cl     *balance.Cluster
	// gen is the generation of the newest stages started or about to be
	// (0: none yet), running that of the stages of this plan (0: none).
	gen, running uint64
	// domain holds the nodes a failure of which breaks the job: the
	// plan's, and while the state moves, the previous plan's too.
	domain map[string]bool
}

// node is the node of stage k (self, the driver's, for
// balance.Coordinator).
func (p *planState) node(k int, self string) (string, bool) {
	if k == balance.Coordinator {
		return self, self != ""
	}
	if k < 0 || k >= len(p.Stages) {
		return "", false
	}
	return p.Stages[k].Node, true
}

// newNode is a node plan uses that the cluster of the current plan did not
// have (one that joined since), or "".
func (p *planState) newNode(plan *balance.Plan) string {
	for _, sp := range plan.Stages {
		if !slices.ContainsFunc(p.cl.Nodes, func(n balance.NodeProfile) bool { return n.Name == sp.Node }) {
			return sp.Node
		}
	}
	return ""
}

// nodeSet is the cluster as the job sees it.
type nodeSet struct {
	members map[string]job.NodeInfo // the live members the job may use now
	known   map[string]job.NodeInfo // every node seen
	speed   map[string]float64      // measured speeds of the nodes that ran a stage
	// perCPU is, for a node under a CPU limit, the work its process does
	// per CPU second, as a speed: a node under a quota spends more CPU on
	// the same passes, and its process's other work takes from the quota.
	perCPU map[string]float64
}

// candidates are the live members a plan may use, by name.
func (ns *nodeSet) candidates() []job.NodeInfo {
	return slices.SortedFunc(maps.Values(ns.members), func(a, b job.NodeInfo) int { return strings.Compare(a.Name, b.Name) })
}

// joinedSince reports whether a member is not among probed.
func (ns *nodeSet) joinedSince(probed map[string]bool) bool {
	for name := range ns.members {
		if !probed[name] {
			return true
		}
	}
	return false
}

// gemmSpeed is n's speed relative to the profile from GEMM speeds: its
// sustained one over ref, the profile's (see Config.GFLOPS), so that
// quotas count. Without them it is 1.
func gemmSpeed(n job.NodeInfo, ref float64) float64 {
	if n.GFLOPS > 0 && ref > 0 {
		return n.GFLOPS / ref
	}
	return 1
}

// stepState is the job's progress through its steps.
type stepState struct {
	next   int             // the next step (the steps done)
	acc    Progress        // what the result has accumulated
	losses job.LossHistory // since the start, or the resumed cut
	// times are every step's duration in seconds, planFrom the index in
	// times of the current plan's first step.
	times    []float64
	planFrom int
	// run is the training time (recoveries and moves excluded), start the
	// current step's start.
	run   time.Duration
	start time.Time
}

// slowedBy is the median of the last rebalanceEvery steps over the median
// of the plan's steps 2 to 6 (the first ones warm up), or 0 before both
// are known.
func (s *stepState) slowedBy() float64 {
	n := s.planFrom + 2 + rebalanceEvery
	if len(s.times) < n+rebalanceEvery {
		return 0
	}
	return balance.Median(s.times[len(s.times)-rebalanceEvery:]) / balance.Median(s.times[n-rebalanceEvery:n])
}

// cutState is the job's consistent cuts: the latest, the interval, and what
// they cost.
type cutState struct {
	latest Cut // held by the driver
	// durable is the step of the latest cut written and copied (or, if
	// cuts do not persist, gathered), count how many cuts got there.
	durable, count int
	// every is the interval in steps (math.MaxInt until chosen), auto
	// whether the core chooses it.
	every int
	auto  bool
	// size is the state's size in bytes; pause, persist and measured are
	// what the last cut cost: its pause, its writing and copying, and its
	// measured cost to the steps around it (0: not yet known).
	size                     int64
	pause, persist, measured time.Duration
	// persisting is the step of the cut being persisted (-1: none), since
	// when; win measures its cost.
	persisting   int
	persistStart time.Time
	win          cutWindow
}

// expectedCost is what the next cut is expected to cost (see cutCost).
func (s *cutState) expectedCost(persists bool) time.Duration {
	return cutCost(s.size, s.pause, s.persist, s.measured, persists)
}

// moveCost predicts what moving as mv costs: starting the new stages and
// sending the layers that change node, at the throughput the last cut
// measured (a cut moves the whole state once), or at the default link's
// bandwidth before the first cut. Moving through a cut costs about two
// cuts.
func (s *cutState) moveCost(mv *stateMove, viaCut bool) time.Duration {
	if viaCut {
		return 2*s.pause + moveStartup
	}
	bw := balance.DefaultLink.Bandwidth
	if s.pause > 0 {
		bw = float64(s.size) / s.pause.Seconds()
	}
	return moveStartup + time.Duration(float64(mv.stateBytes)/bw*float64(time.Second))
}

// opState is the operations asked of the driver.
type opState struct {
	last Op // the last one numbered (0: none yet, the job has not started)
	// wait is the one waited for (0: none), of kind, asked for at start.
	wait  Op
	kind  opKind
	start time.Time
	out   []Action // not yet returned by Ready
}

// opKind is what the core waits for.
type opKind int

const (
	opNone opKind = iota
	opStep
	opCut      // a periodic cut
	opEvaluate // a cut with the test accuracy, at an epoch's end or the job's
	opProbe
	opMeasure // probing links while training
	opStart
	opLoad
	opChangeCut // the cut a change through a cut starts with
)

// issue asks for an operation of kind, made by a from its number, and
// waits for its outcome.
func (o *opState) issue(now time.Time, kind opKind, a func(Op) Action) {
	o.last++
	o.wait, o.kind, o.start = o.last, kind, now
	o.out = append(o.out, a(o.last))
}

// rebalancing is what the core keeps to decide when to change the plan.
type rebalancing struct {
	// planStep is the step the plan started at; streak the evaluations in
	// a row that favoured a change.
	planStep, streak int
	// check follows the last re-plan until measured.
	check replanCheck
	// requested is a re-plan a user asked for.
	requested *ReplanRequested
}
