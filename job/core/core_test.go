package core

import (
	"container/heap"
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
	"github.com/ppnode/ppnode/balance"
	"github.com/ppnode/ppnode/job"
)

// TestCore runs the policy scripts in testdata/core against the core, with
// a simulated cluster and a fake clock: no socket, no goroutine, no wall
// time. See sim for the commands.
func TestCore(t *testing.T) {
	datadriven.Walk(t, "testdata/core", func(t *testing.T, path string) {
		var s *sim
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			if d.Cmd == "job" {
				s = newSim(t, d)
				return s.flush()
			}
			if s == nil {
				d.Fatalf(t, "the script must start with job")
			}
			return s.command(t, d)
		})
	})
}

// sim is a simulated cluster running one job's core. Each node has a true
// speed (relative to the reference of the profile); a step takes the time
// the simulator predicts for the plan at the true speeds (plus an extra
// overhead the model does not know of, if set), and each stage reports
// the busy time the simulator gives it. Cuts pause the pipeline for a time
// proportional to the state's size and persist in the background.
//
// Commands:
//
//	job nodes=a:1,b:1:64MB model=mlp32 width=128 batch=48 micro=4 samples=2880
//	    steps=60 [checkpoint=K] [partition=P] [schedule=S] [chunks=V] [optimizer=O]
//	    [no-rebalance] [eval-each-epoch] [persist] [resume=STEP] [takeover]
//	    [generation=G] [probes]                      the job, planned (probes: the
//	                                                   nodes answer link probes)
//	run [to=STEP] [until=replan|recovery|paused] [for=D] [trace] [evals]
//	                                                   runs; prints what changed, with trace
//	                                                   every operation, with evals every
//	                                                   rebalancing evaluation
//	speed NODE=V ... [flicker=V2] [every=N]            true speeds from now
//	quota NODE=Q ... [cpu=F]                           a CPU quota of Q from now, under which its
//	                                                   passes take F times the CPU (default 1):
//	                                                   speed Q/F, the passes as fast as before
//	                                                   (times F), capacity Q and CPU time reported
//	extra D                                            a step costs D more than the model says
//	kill NODE [at=STEP] [silent]                       NODE dies now or when step STEP starts;
//	                                                   silent: the cluster does not notice (a hung node)
//	revive NODE                                        a killed node answers again
//	join NODE:SPEED[:MEMORY]                           a member joins
//	leave NODE                                         a member leaves
//	request PARTITION [via-cut]                        a user asks for a re-plan
//	link A B MBIT                                      the true rate of the link A-B, both ways
//	                                                   (default 1000; probes measure it, steps pay it)
//	links                                              the job's link table
//	fail-next OP [times=N]                             the next (N) start, restore, move or cut fails
//	loss V [at=STEP]                                   the steps asked for from now (or from step
//	                                                   STEP on) report loss V (NaN, +Inf...); else 1
//	status                                             the job's status
type sim struct {
	t       *testing.T
	job     *job.Job
	prof    *balance.ModelProfile
	core    *Core
	now     time.Time
	started bool
	speed   map[string]float64
	// quota is, for a node under a CPU quota, its share of a CPU: its
	// passes, run in bursts between throttles, look as fast as at its
	// speed before the quota (burst), it reports the quota's capacity and
	// its CPU time (its passes'), and it computes at its speed over a
	// step.
	quota    map[string]float64
	burst    map[string]float64
	flicker  map[string][2]float64
	every    int
	extra    time.Duration
	nodes    map[string]job.NodeInfo
	dead     map[string]bool
	killAt   map[int]killing
	failNext map[string]int
	stages   map[uint64]*balance.Plan // running stages, by generation
	queue    evQueue
	seq      int
	ops      map[Op]uint64 // operations in flight -> their generation
	timeout  map[Op]time.Duration
	trace    bool
	evals    bool     // print the rebalancing evaluations
	stepRun  *stepRun // steps not yet traced
	out      strings.Builder
	last     job.Status
	simCache map[string]*balance.Report
	rates    map[[2]string]float64 // true link rates (bytes/s), both ways
	probes   bool                  // nodes answer link probes
	loss     *stepLoss             // the loss the steps report from a step on (nil: 1)
}

// stepLoss is the loss the steps report from step from on.
type stepLoss struct {
	from int
	v    float64
}

const refGFLOPS = 10

func newSim(t *testing.T, d *datadriven.TestData) *sim {
	s := &sim{t: t, now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), speed: map[string]float64{}, quota: map[string]float64{}, burst: map[string]float64{}, flicker: map[string][2]float64{},
		nodes: map[string]job.NodeInfo{}, dead: map[string]bool{}, killAt: map[int]killing{}, failNext: map[string]int{},
		stages: map[uint64]*balance.Plan{}, ops: map[Op]uint64{}, timeout: map[Op]time.Duration{}, simCache: map[string]*balance.Report{},
		rates: map[[2]string]float64{}}
	spec := job.DefaultSpec()
	spec.ID, spec.Data, spec.Deterministic, spec.Threads, spec.Epochs = "sim", "synthetic:8x8x1:4", true, 1, 100
	spec.Width, spec.Batch, spec.MicroBatches, spec.SyntheticSamples, spec.Steps = 128, 48, 4, 2880, 60
	var nodes []job.NodeInfo
	cfg := Config{GFLOPS: refGFLOPS, Backend: "sim", Logger: slog.New(evalLog{s}), Now: s.now}
	for _, a := range d.CmdArgs {
		if a.Key == "probes" {
			s.probes = true
		}
	}
	for _, a := range d.CmdArgs {
		v := ""
		if len(a.Vals) > 0 {
			v = a.Vals[0]
		}
		switch a.Key {
		case "nodes":
			for _, n := range strings.Split(v, ",") {
				nodes = append(nodes, s.parseNode(n))
			}
		case "model":
			spec.Model = v
		case "width":
			spec.Width = s.float(v)
		case "batch":
			spec.Batch = int(s.float(v))
		case "micro":
			spec.MicroBatches = int(s.float(v))
		case "samples":
			spec.SyntheticSamples = int(s.float(v))
		case "steps":
			spec.Steps = int(s.float(v))
		case "checkpoint":
			spec.CheckpointEvery = int(s.float(v))
		case "partition":
			spec.Partition = v
		case "schedule":
			spec.Schedule = v
		case "chunks":
			spec.Chunks = int(s.float(v))
		case "optimizer":
			spec.Optimizer = v
		case "no-rebalance":
			spec.NoRebalance = true
		case "eval-each-epoch":
			spec.EvalEachEpoch = true
		case "persist":
			cfg.Persists = true
		case "resume":
			cfg.Resume = &Cut{Step: int(s.float(v)), Progress: Progress{Loss: 1}}
		case "takeover":
			cfg.Takeover = true
		case "generation":
			cfg.Generation = uint64(s.float(v))
		case "probes":
		default:
			d.Fatalf(t, "job: unknown argument %q", a.Key)
		}
	}
	j, err := prepare(spec)
	if err != nil {
		d.Fatalf(t, "%v", err)
	}
	s.job = j
	s.prof = balance.Analytic(j.Graph, balance.AnalyticOptions{GFLOPS: refGFLOPS, Overhead: 20 * time.Microsecond})
	cfg.Job, cfg.Profile, cfg.Nodes = j, s.prof, nodes
	if s.core, err = New(cfg); err != nil {
		fmt.Fprintf(&s.out, "error: %v\n", err)
		return s
	}
	fmt.Fprintf(&s.out, "plan %s\n", s.core.Describe())
	s.last = s.core.Status()
	return s
}

func (s *sim) parseNode(desc string) job.NodeInfo {
	parts := strings.Split(desc, ":")
	n := job.NodeInfo{Name: parts[0], ActorAddr: parts[0] + ":1", GFLOPS: refGFLOPS}
	if s.probes {
		n.ProbeAddr = parts[0] + ":2"
	}
	if len(parts) > 1 {
		n.GFLOPS = refGFLOPS * s.float(parts[1])
	}
	if len(parts) > 2 {
		b, err := balance.ParseBytes(parts[2])
		if err != nil {
			s.t.Fatal(err)
		}
		n.Memory = b
	}
	s.nodes[n.Name] = n
	s.speed[n.Name] = n.GFLOPS / refGFLOPS
	return n
}

func (s *sim) float(v string) float64 {
	f, err := strconv.ParseFloat(v, 64)
	if err != nil {
		s.t.Fatalf("number %q: %v", v, err)
	}
	return f
}

func (s *sim) command(t *testing.T, d *datadriven.TestData) string {
	if s.core == nil {
		d.Fatalf(t, "the job was refused")
	}
	arg := func(k string) (string, bool) {
		for _, a := range d.CmdArgs {
			if a.Key == k {
				if len(a.Vals) == 0 {
					return "", true
				}
				return a.Vals[0], true
			}
		}
		return "", false
	}
	switch d.Cmd {
	case "run":
		to := -1
		if v, ok := arg("to"); ok {
			to = int(s.float(v))
		}
		until, _ := arg("until")
		limit := 10 * time.Minute
		if v, ok := arg("for"); ok {
			dur, err := time.ParseDuration(v)
			if err != nil {
				d.Fatalf(t, "%v", err)
			}
			limit = dur
		}
		_, s.trace = arg("trace")
		_, s.evals = arg("evals")
		s.run(to, until, s.now.Add(limit))
	case "speed":
		for _, a := range d.CmdArgs {
			switch a.Key {
			case "flicker":
			case "every":
				s.every = int(s.float(a.Vals[0]))
			default:
				s.speed[a.Key] = s.float(a.Vals[0])
				if v, ok := arg("flicker"); ok {
					s.flicker[a.Key] = [2]float64{s.speed[a.Key], s.float(v)}
				}
			}
		}
	case "quota":
		f := 1.0
		if v, ok := arg("cpu"); ok {
			f = s.float(v)
		}
		for _, a := range d.CmdArgs {
			if a.Key == "cpu" {
				continue
			}
			q := s.float(a.Vals[0])
			if _, ok := s.burst[a.Key]; !ok {
				s.burst[a.Key] = s.speed[a.Key]
			}
			s.quota[a.Key], s.speed[a.Key] = q, q/f
		}
	case "extra":
		dur, err := time.ParseDuration(d.CmdArgs[0].Key)
		if err != nil {
			d.Fatalf(t, "%v", err)
		}
		s.extra = dur
	case "kill":
		_, silent := arg("silent")
		if v, ok := arg("at"); ok {
			s.killAt[int(s.float(v))] = killing{d.CmdArgs[0].Key, silent}
		} else {
			s.kill(d.CmdArgs[0].Key, silent)
		}
	case "revive":
		delete(s.dead, d.CmdArgs[0].Key)
	case "join":
		s.parseNode(d.CmdArgs[0].Key)
		s.members()
	case "leave":
		delete(s.nodes, d.CmdArgs[0].Key)
		s.members()
	case "request":
		_, via := arg("via-cut")
		s.deliver(ReplanRequested{Partition: strings.TrimSpace(d.Input), ViaCut: via})
	case "fail-next":
		n := 1
		if v, ok := arg("times"); ok {
			n = int(s.float(v))
		}
		s.failNext[d.CmdArgs[0].Key] = n
	case "loss":
		l := &stepLoss{v: s.float(d.CmdArgs[0].Key)}
		if v, ok := arg("at"); ok {
			l.from = int(s.float(v))
		}
		s.loss = l
	case "link":
		a, b, mbit := d.CmdArgs[0].Key, d.CmdArgs[1].Key, s.float(d.CmdArgs[2].Key)
		s.rates[[2]string{a, b}], s.rates[[2]string{b, a}] = mbit*1e6/8, mbit*1e6/8
		clear(s.simCache)
	case "links":
		for _, l := range s.core.Status().Links {
			fmt.Fprintf(&s.out, "%s->%s %.0f Mbit/s %s\n", l.From, l.To, l.MbitPerSec, l.Source)
		}
	case "status":
		st := s.core.Status()
		fmt.Fprintf(&s.out, "state %s step %d/%d plan %s\n", st.State, st.Step, st.Total, st.Plan)
		fmt.Fprintf(&s.out, "cuts %d latest %d every %d; recoveries %d; re-plans %d\n", st.Cuts, st.LatestCut, st.CheckpointEvery, len(st.Recoveries), len(st.Replans))
		if st.Reason != "" {
			fmt.Fprintf(&s.out, "reason %s\n", st.Reason)
		}
		if st.Error != "" {
			fmt.Fprintf(&s.out, "error %s\n", st.Error)
		}
		if e := st.Evaluation; e != nil {
			fmt.Fprintf(&s.out, "evaluating the weights after step %d: %d of %d samples\n", e.Step, e.Done, e.Samples)
		}
	default:
		d.Fatalf(t, "unknown command %q", d.Cmd)
	}
	return s.flush()
}

func (s *sim) flush() string {
	s.flushSteps()
	out := s.out.String()
	s.out.Reset()
	if out == "" {
		return "ok\n"
	}
	return out
}

// members tells the core the live members.
func (s *sim) members() {
	var ms []job.NodeInfo
	for _, n := range s.nodes {
		ms = append(ms, n)
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].Name < ms[j].Name })
	s.deliver(Members{Nodes: ms})
}

// deliver gives the core an event now and carries out what it asks.
func (s *sim) deliver(ev Event) {
	if e, ok := ev.(StepFinished); s.trace && (!ok || e.Err != nil) {
		s.line("<- %s", describe(ev))
	}
	if t, ok := ev.(tick); ok {
		s.core.Tick(t.at)
	} else {
		s.core.Step(s.now, ev)
	}
	s.react()
}

type tick struct{ at time.Time }

// stepRun is a run of steps on one generation, traced as one line.
type stepRun struct {
	from, to int
	gen      uint64
	at       string
}

func (tick) event() {}

// line prints a line of the output, stamped with the time.
func (s *sim) line(format string, a ...any) {
	s.flushSteps()
	fmt.Fprintf(&s.out, "%s %s\n", s.clock(), fmt.Sprintf(format, a...))
}

// flushSteps prints the run of steps not yet traced.
func (s *sim) flushSteps() {
	if r := s.stepRun; r != nil {
		s.stepRun = nil
		what := fmt.Sprintf("steps %d-%d", r.from, r.to)
		if r.from == r.to {
			what = fmt.Sprintf("step %d", r.from)
		}
		fmt.Fprintf(&s.out, "%s -> %s on gen %d\n", r.at, what, r.gen)
	}
}

// steps folds a run of steps on one generation into one line of trace.
func (s *sim) steps(r RunStep) {
	if p := s.stepRun; p != nil && p.to+1 == r.Step && p.gen == r.Gen {
		p.to = r.Step
		return
	}
	s.flushSteps()
	s.stepRun = &stepRun{from: r.Step, to: r.Step, gen: r.Gen, at: s.clock()}
}

func (s *sim) clock() string {
	return fmt.Sprintf("%7.1fms", float64(s.now.Sub(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)).Microseconds())/1e3)
}

// run starts the job if needed and delivers events until step to has
// completed, the condition holds, the job ends, or the next event is past
// deadline.
func (s *sim) run(to int, until string, deadline time.Time) {
	if !s.started {
		s.started = true
		s.core.Start(s.now)
		s.react()
	}
	for !s.core.Ended() && s.queue.Len() > 0 {
		if to >= 0 && s.core.status.Step >= to {
			break
		}
		if s.queue[0].at.After(deadline) {
			s.flushSteps()
			fmt.Fprintf(&s.out, "(running at %s)\n", s.clock())
			break
		}
		before := s.core.Status()
		it := heap.Pop(&s.queue).(*queued)
		s.now = it.at
		s.deliver(it.ev)
		st := s.core.Status()
		switch until {
		case "replan":
			if len(st.Replans) > len(before.Replans) {
				return
			}
		case "recovery":
			if len(st.Recoveries) > len(before.Recoveries) {
				return
			}
		case "paused":
			if st.State == job.StatePaused {
				return
			}
		}
	}
}

// react carries out the actions the core asks for and reports what
// changed in its status.
func (s *sim) react() {
	for _, a := range s.core.Ready() {
		if r, ok := a.(RunStep); ok && s.trace {
			s.steps(r)
		} else if s.trace {
			s.line("-> %s", describe(a))
		}
		s.exec(a)
	}
	s.report()
}

func (s *sim) after(d time.Duration, ev Event) {
	s.seq++
	heap.Push(&s.queue, &queued{at: s.now.Add(d), seq: s.seq, ev: ev})
}

// exec carries out one action.
func (s *sim) exec(a Action) {
	switch a := a.(type) {
	case Probe:
		var live []job.NodeInfo
		for _, n := range a.Nodes {
			if !s.dead[n.Name] {
				live = append(live, n)
			}
		}
		var ms []LinkMeasure
		for _, p := range a.Links {
			if !s.dead[p[0]] && !s.dead[p[1]] {
				ms = append(ms, LinkMeasure{From: p[0], To: p[1], BytesPerSec: s.rate(p[0], p[1]), RTT: 100 * time.Microsecond})
			}
		}
		s.after(time.Millisecond+time.Duration(len(ms))*200*time.Millisecond, Probed{Op: a.Op, Live: live, Links: ms})
	case StartStages:
		s.ops[a.Op] = a.Gen
		if err := s.check("start", a.Plan); err != nil {
			s.after(5*time.Millisecond, StagesStarted{Op: a.Op, Err: err})
			return
		}
		s.stages[a.Gen] = a.Plan
		s.after(20*time.Millisecond, StagesStarted{Op: a.Op, Params: make([]int64, len(a.Plan.Stages))})
	case Restore:
		s.ops[a.Op] = a.Gen
		if err := s.check("restore", s.stages[a.Gen]); err != nil {
			s.after(5*time.Millisecond, StateLoaded{Op: a.Op, Err: err})
			return
		}
		s.after(s.stateTime(s.core.cuts.size), StateLoaded{Op: a.Op})
	case Move:
		s.ops[a.Op] = a.Gen
		err := s.check("move", s.stages[a.Gen])
		if old := s.stages[a.From]; err == nil && old == nil {
			err = s.check("", old)
		}
		for _, srcs := range a.Sources { // the old stages that send
			for _, src := range srcs {
				if node := s.stages[a.From].Stages[src.From].Node; err == nil && s.dead[node] {
					err = fmt.Errorf("node %s does not answer", node)
				}
			}
		}
		if err != nil {
			s.after(5*time.Millisecond, StateLoaded{Op: a.Op, Err: err})
			return
		}
		var moved int64
		for _, srcs := range a.Sources {
			for _, src := range srcs {
				if !src.Local {
					for _, l := range src.Layers {
						moved += stateBytes(s.job.Spec, s.job.Graph.Node(l).Layer.Params())
					}
				}
			}
		}
		s.after(moveStartup+s.stateTime(moved), StateLoaded{Op: a.Op, Moved: &Moved{Bytes: moved}})
	case RunStep:
		s.ops[a.Op] = a.Gen
		s.timeout[a.Op] = a.Timeout
		plan := s.stages[a.Gen]
		if k, ok := s.killAt[a.Step]; ok {
			delete(s.killAt, a.Step)
			s.kill(k.node, k.silent)
		}
		if err := s.check("", plan); err != nil {
			s.after(a.Timeout, StepFinished{Op: a.Op, Err: err})
			return
		}
		rep := s.simulate(plan)
		timings := make([]StageTiming, len(rep.Stages))
		cpu := map[string]time.Duration{} // a quota node's passes, all its stages'
		for k, st := range rep.Stages {
			busy := time.Duration(st.Busy * float64(time.Second))
			if q, ok := s.quota[st.Node]; ok {
				busy = time.Duration(float64(busy) * q / s.burst[st.Node])
				cpu[st.Node] += busy
				timings[k].CapacityGFLOPS, timings[k].CPUs = q*refGFLOPS, q
			}
			timings[k].Forward, timings[k].Backward, timings[k].Wall = busy/3, busy-busy/3, time.Duration(rep.StepTime*float64(time.Second))
		}
		for k, st := range rep.Stages {
			timings[k].CPU = cpu[st.Node]
		}
		for _, e := range rep.Events {
			if !e.Link() && e.Stage >= 0 {
				timings[e.Stage].Passes = append(timings[e.Stage].Passes, Pass{Op: e.Op, Micro: e.Micro,
					Start: time.Duration(e.Start * float64(time.Second)), Dur: time.Duration((e.End - e.Start) * float64(time.Second))})
			}
		}
		// The senders wait for their links as long as the links are busy.
		for _, l := range rep.Links {
			kind := "activation"
			if l.From > l.To {
				kind = "gradient"
			}
			timings[l.From].Links = append(timings[l.From].Links, LinkSent{Peer: l.To, Kind: kind, Codec: "raw", Frames: 1,
				RawBytes: int64(l.Bytes), WireBytes: int64(l.Bytes), Write: time.Duration(l.Busy * float64(time.Second))})
		}
		d := time.Duration(rep.StepTime*float64(time.Second)) + s.extra
		loss := 1.0
		if s.loss != nil && a.Step >= s.loss.from {
			loss = s.loss.v
		}
		s.after(d, StepFinished{Op: a.Op, Loss: loss, Correct: 1, Seen: int64(s.job.Spec.Batch), Timings: timings})
		if s.every > 0 && (a.Step+1)%s.every == 0 {
			for n, f := range s.flicker {
				if s.speed[n] == f[0] {
					s.speed[n] = f[1]
				} else {
					s.speed[n] = f[0]
				}
			}
		}
	case TakeCut:
		s.ops[a.Op] = a.Gen
		if err := s.check("cut", s.stages[a.Gen]); err != nil {
			s.after(5*time.Millisecond, CutTaken{Op: a.Op, Err: err})
			return
		}
		pause := s.stateTime(s.core.cuts.size)
		if a.Evaluate {
			// The evaluation's news halfway, and a stale one of another step.
			s.after(pause/2, Evaluating{Step: a.Step, Done: 50, Samples: 100})
			s.after(pause/2, Evaluating{Step: a.Step - 1, Done: 70, Samples: 100})
		}
		s.after(pause, CutTaken{Op: a.Op, Accuracy: 0.5, WeightsSHA256: "sim"})
		if s.core.cfg.Persists {
			s.after(pause+4*pause, CutPersisted{Step: a.Step})
		}
	case StopStages:
		delete(s.stages, a.Gen)
		// An operation on those stages ends at once, and its answer is
		// stale.
		for op, gen := range s.ops {
			if gen == a.Gen {
				s.cancel(op)
			}
		}
	case Wake:
		s.seq++
		heap.Push(&s.queue, &queued{at: a.At, seq: s.seq, ev: tick{a.At}})
	case Finish:
		if a.Err != nil {
			s.line("finish: %v", a.Err)
		} else {
			s.line("finish: %d steps, plan %s", a.Result.Steps, a.Result.Plan)
		}
	default:
		s.t.Fatalf("unknown action %T", a)
	}
}

// killing is a node to kill when a step starts.
type killing struct {
	node   string
	silent bool
}

// kill kills a node now: the operations in flight on its stages fail when
// they would have ended (a hung node's, silent, only at the step's
// timeout), and unless silent the cluster reports it 3 ms later.
func (s *sim) kill(node string, silent bool) {
	s.dead[node] = true
	delete(s.nodes, node)
	for _, q := range s.queue {
		op, err := opOf(q.ev)
		if err != nil {
			continue
		}
		if gen, ok := s.ops[op]; ok && s.check("", s.stages[gen]) != nil {
			if silent {
				if _, ok := q.ev.(StepFinished); ok {
					q.at = s.now.Add(s.timeout[op])
				}
			}
			q.ev = failed(q.ev, fmt.Errorf("node %s does not answer", node))
		}
	}
	heap.Init(&s.queue)
	if !silent {
		s.after(3*time.Millisecond, NodeFailed{Name: node})
	}
}

// cancel replaces the queued answer of op by an error delivered now.
func (s *sim) cancel(op Op) {
	for _, q := range s.queue {
		if o, err := opOf(q.ev); err == nil && o == op {
			q.at, q.ev = s.now, failed(q.ev, fmt.Errorf("stages stopped"))
			heap.Init(&s.queue)
		}
	}
	delete(s.ops, op)
}

// failed is ev failed with err.
func failed(ev Event, err error) Event {
	switch e := ev.(type) {
	case StagesStarted:
		return StagesStarted{Op: e.Op, Err: err}
	case StateLoaded:
		return StateLoaded{Op: e.Op, Err: err}
	case StepFinished:
		return StepFinished{Op: e.Op, Err: err}
	case CutTaken:
		return CutTaken{Op: e.Op, Err: err}
	}
	return ev
}

// check fails an operation on plan's nodes if one is dead, or if it was
// told to fail.
func (s *sim) check(op string, plan *balance.Plan) error {
	if op != "" && s.failNext[op] > 0 {
		s.failNext[op]--
		return fmt.Errorf("%s failed (injected)", op)
	}
	if plan == nil {
		return fmt.Errorf("no such stages")
	}
	for _, sp := range plan.Stages {
		if s.dead[sp.Node] {
			return fmt.Errorf("node %s does not answer", sp.Node)
		}
	}
	return nil
}

// stateTime is how long moving b bytes of state takes (500 MB/s).
func (s *sim) stateTime(b int64) time.Duration {
	return time.Millisecond + time.Duration(float64(b)/500e6*float64(time.Second))
}

// rate is the true rate of the link from a to b.
func (s *sim) rate(a, b string) float64 {
	if r, ok := s.rates[[2]string{a, b}]; ok {
		return r
	}
	return balance.DefaultLink.Bandwidth
}

// simulate is plan's step at the nodes' true speeds and the links' true
// rates.
func (s *sim) simulate(plan *balance.Plan) *balance.Report {
	cl := &balance.Cluster{DefaultLink: balance.DefaultLink}
	var key strings.Builder
	fmt.Fprintf(&key, "%p", plan)
	for _, sp := range plan.Stages {
		if !slices.ContainsFunc(cl.Nodes, func(n balance.NodeProfile) bool { return n.Name == sp.Node }) {
			cl.Nodes = append(cl.Nodes, balance.NodeProfile{Name: sp.Node, Speed: s.speed[sp.Node]})
			fmt.Fprintf(&key, " %s=%g", sp.Node, s.speed[sp.Node])
		}
	}
	for _, a := range cl.Nodes {
		for _, b := range cl.Nodes {
			if a.Name != b.Name {
				cl.Links = append(cl.Links, balance.LinkProfile{From: a.Name, To: b.Name, Bandwidth: s.rate(a.Name, b.Name), Latency: balance.DefaultLink.Latency})
			}
		}
	}
	if r, ok := s.simCache[key.String()]; ok {
		return r
	}
	r, err := balance.Simulate(plan, s.job.Graph, s.prof, cl, balance.SimOptions{Optimizer: s.job.Spec.Optimizer})
	if err != nil {
		s.t.Fatal(err)
	}
	s.simCache[key.String()] = r
	return r
}

// report prints what changed in the status since the last report.
func (s *sim) report() {
	st := s.core.Status()
	old := s.last
	s.last = st
	if st.State != old.State && !(st.State == job.StateTraining && old.State == job.StateStarting) {
		line := fmt.Sprintf("step %d: %s", st.Step, st.State)
		if st.Reason != "" {
			line += ": " + st.Reason
		}
		s.line("%s", line)
	}
	for _, r := range st.Recoveries[len(old.Recoveries):] {
		s.line("recovery: step %d failed (%s), from the %s, replayed %d, plan %s", r.Step, r.Cause, r.From, r.Replayed, r.Plan)
	}
	for _, r := range st.Replans[len(old.Replans):] {
		s.line("re-plan at step %d (%s, %s): %s; gain %.2f, cost %.1f ms, moved %d of %d bytes", r.Step, r.Trigger, r.Method,
			r.Plan, r.Gain, r.CostMS, r.MovedBytes, r.StateBytes)
		s.line("  reason: %s", r.Reason)
	}
	for i := range min(len(st.Replans), len(old.Replans)) {
		if r := st.Replans[i]; r.MeasuredAfterMS != old.Replans[i].MeasuredAfterMS {
			s.line("re-plan at step %d measured: %.1f ms before, %.1f ms after (predicted %.1f -> %.1f)", r.Step,
				r.MeasuredBeforeMS, r.MeasuredAfterMS, r.BeforeMS, r.AfterMS)
		}
	}
	if s.trace && st.LatestCut != old.LatestCut {
		s.line("latest cut %d", st.LatestCut)
	}
}

func describe(x any) string {
	switch x := x.(type) {
	case Probe:
		var names []string
		for _, n := range x.Nodes {
			names = append(names, n.Name)
		}
		return fmt.Sprintf("probe %s", strings.Join(names, ","))
	case Probed:
		var names []string
		for _, n := range x.Live {
			names = append(names, n.Name)
		}
		return fmt.Sprintf("probed: %s", strings.Join(names, ","))
	case StartStages:
		src := ""
		if x.Sources != nil {
			src = " (direct)"
		}
		return fmt.Sprintf("start gen %d%s", x.Gen, src)
	case Restore:
		return fmt.Sprintf("restore gen %d from the cut at step %d", x.Gen, x.Step)
	case Move:
		return fmt.Sprintf("move gen %d -> gen %d at step %d", x.From, x.Gen, x.Step)
	case RunStep:
		return fmt.Sprintf("step %d on gen %d", x.Step, x.Gen)
	case TakeCut:
		ev := ""
		if x.Evaluate {
			ev = " and evaluate"
		}
		return fmt.Sprintf("cut at step %d on gen %d%s", x.Step, x.Gen, ev)
	case StopStages:
		how := "abandon"
		if x.Wait {
			how = "stop"
		}
		return fmt.Sprintf("%s gen %d", how, x.Gen)
	case Wake:
		return "wake at " + x.At.Format("15:04:05.000")
	case Finish:
		return "finish"
	case StagesStarted:
		return "started" + errText(x.Err)
	case StateLoaded:
		return "loaded" + errText(x.Err)
	case StepFinished:
		return "step done" + errText(x.Err)
	case CutTaken:
		return "cut taken" + errText(x.Err)
	case CutPersisted:
		return fmt.Sprintf("cut %d persisted%s", x.Step, errText(x.Err))
	case Evaluating:
		return fmt.Sprintf("evaluated %d of %d samples of the weights after step %d", x.Done, x.Samples, x.Step)
	case NodeFailed:
		return "node failed: " + x.Name
	case Members:
		var names []string
		for _, n := range x.Nodes {
			names = append(names, n.Name)
		}
		return "members " + strings.Join(names, ",")
	case ReplanRequested:
		return "re-plan requested: " + x.Partition
	case tick:
		return "tick"
	}
	return fmt.Sprintf("%T", x)
}

func errText(err error) string {
	if err != nil {
		return ": " + err.Error()
	}
	return ""
}

type queued struct {
	at  time.Time
	seq int
	ev  Event
}

// evQueue orders events by time, then by when they were queued.
type evQueue []*queued

func (q evQueue) Len() int { return len(q) }
func (q evQueue) Less(i, j int) bool {
	if !q[i].at.Equal(q[j].at) {
		return q[i].at.Before(q[j].at)
	}
	return q[i].seq < q[j].seq
}
func (q evQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *evQueue) Push(x any)   { *q = append(*q, x.(*queued)) }
func (q *evQueue) Pop() any {
	old := *q
	it := old[len(old)-1]
	*q = old[:len(old)-1]
	return it
}

// evalLog prints the core's rebalancing evaluations when the sim's evals
// is set, and drops every other log line.
type evalLog struct{ s *sim }

func (h evalLog) Enabled(context.Context, slog.Level) bool { return true }

func (h evalLog) Handle(_ context.Context, r slog.Record) error {
	if !h.s.evals || r.Message != "rebalancing: evaluated" {
		return nil
	}
	var parts []string
	r.Attrs(func(a slog.Attr) bool {
		switch a.Key {
		case "step", "plan", "streak":
			parts = append(parts, fmt.Sprintf("%s %v", a.Key, a.Value))
		case "gain", "realism":
			parts = append(parts, fmt.Sprintf("%s %.2f", a.Key, a.Value.Float64()))
		case "speeds":
			sp := a.Value.Any().(map[string]float64)
			var ss []string
			for _, n := range slices.Sorted(maps.Keys(sp)) {
				ss = append(ss, fmt.Sprintf("%s=%.2f", n, sp[n]))
			}
			parts = append(parts, "speeds "+strings.Join(ss, " "))
		}
		return true
	})
	h.s.line("evaluated: %s", strings.Join(parts, ", "))
	return nil
}

func (h evalLog) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h evalLog) WithGroup(string) slog.Handler      { return h }

// prepare checks spec and prepares its job.
func prepare(spec job.Spec) (*job.Job, error) {
	c, err := job.Check(spec)
	if err != nil {
		return nil, err
	}
	return c.Prepare()
}
