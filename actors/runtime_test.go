package actors

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/ppnode/ppnode/balance"
	"github.com/ppnode/ppnode/dataplane"
	"github.com/ppnode/ppnode/job"
	"github.com/ppnode/ppnode/tensorio"
)

// testCluster is n actor systems in this process, each hosting stages, all
// on one data plane.
type testCluster struct {
	hosts   []*StageHost
	systems []*System
	nodes   []job.NodeInfo
	dp      dataplane.DataPlane
}

func newTestCluster(t testing.TB, n int, dp dataplane.DataPlane) *testCluster {
	t.Helper()
	tc := &testCluster{dp: dp}
	quiet := slog.New(slog.DiscardHandler)
	for i := range n {
		host := &StageHost{DataPlane: dp, Threads: 1, Logger: quiet}
		tc.hosts = append(tc.hosts, host)
		sys, err := Start(Config{Kinds: map[string]*actor.Props{StageKind: StageProps(host)}, Logger: quiet, LogLevel: slog.LevelError})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(sys.Stop)
		tc.systems = append(tc.systems, sys)
		tc.nodes = append(tc.nodes, job.NodeInfo{Name: string(rune('a' + i)), ActorAddr: sys.Address()})
	}
	return tc
}

func (tc *testCluster) run(t testing.TB, spec job.Spec, nodes int) (*job.Result, *Coordinator) {
	t.Helper()
	c, err := NewCoordinator(spec, CoordinatorConfig{System: tc.systems[0], DataPlane: tc.dp, Nodes: tc.nodes[:nodes], Threads: 1,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	res, err := c.Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return res, c
}

func smallSpec(model string) job.Spec {
	s := job.DefaultSpec()
	s.ID = "job-" + model
	s.Model = model
	s.Data = "synthetic:8x8x1:4"
	s.SyntheticSamples = 96
	s.Batch, s.MicroBatches, s.Epochs, s.Steps = 24, 4, 1, 3
	s.Deterministic = true
	s.Threads = 1
	switch model {
	case "mlp32":
		s.Width = 16
	case "uno":
		s.Width = 0.05
	case "resnet50":
		s.Width = 1.0 / 16
		s.Data = "synthetic:8x8x3:4"
	case "vgg16":
		s.Width = 1.0 / 16
		s.Data = "synthetic:32x32x1:4"
	}
	return s
}

func localSHA(t *testing.T, spec job.Spec) string {
	t.Helper()
	j, err := spec.Prepare()
	if err != nil {
		t.Fatal(err)
	}
	res, err := j.TrainLocal(1, nil)
	if err != nil {
		t.Fatal(err)
	}
	return res.WeightsSHA256
}

// A pipelined job across actor systems gives the weights of one process,
// bit for bit, for every model, schedule and partition tried.
func TestPipelinedJobIsBitIdentical(t *testing.T) {
	tc := newTestCluster(t, 4, &dataplane.Inmem{})
	cases := []struct {
		model, partition, schedule string
		nodes                      int
	}{
		{"mlp32", "auto", "auto", 1},
		{"mlp32", "uniform", "gpipe", 2},
		{"mlp32", "uniform", "1f1b", 3},
		{"mlp32", "fc1-fc3@a; fc4-fc20@b; fc21-fc30@c; fc31-fc32@d", "1f1b", 4},
		{"mlp32", "fc1-fc16@b; fc17-fc32@a", "gpipe", 2},
		{"uno", "flatten + tower3.slice-tower3.fc3@a; tower2.slice-tower2.fc3@b; tower1.slice-tower1.fc3@c; concat-out@d", "graph", 4},
		{"resnet50", "uniform", "1f1b", 3},
		{"vgg16", "auto", "auto", 2},
	}
	if testing.Short() {
		cases = cases[1:4]
	}
	want := map[string]string{}
	for _, c := range cases {
		t.Run(fmt.Sprintf("%s/%s/%s/%d", c.model, c.partition, c.schedule, c.nodes), func(t *testing.T) {
			spec := smallSpec(c.model)
			spec.Partition, spec.Schedule = c.partition, c.schedule
			if want[c.model] == "" {
				want[c.model] = localSHA(t, spec)
			}
			spec.ID = strings.NewReplacer(" ", "", ";", "_", "@", "_").Replace(t.Name())
			res, co := tc.run(t, spec, c.nodes)
			t.Logf("plan %s (%s, M=%d), stages %d, loss %.4f", res.Plan, res.Schedule, res.MicroBatches, len(co.Plan().Stages), res.TrainLoss)
			if res.WeightsSHA256 != want[c.model] {
				t.Fatalf("pipelined weights %s, single process %s", res.WeightsSHA256[:16], want[c.model][:16])
			}
		})
	}
}

// The same over real dataplane.TCP links.
func TestPipelinedJobOverTCP(t *testing.T) {
	tc := newTestCluster(t, 3, &dataplane.TCP{})
	spec := smallSpec("mlp32")
	spec.Partition, spec.Schedule = "uniform", "1f1b"
	want := localSHA(t, spec)
	res, _ := tc.run(t, spec, 3)
	if res.WeightsSHA256 != want {
		t.Fatalf("pipelined weights %s, single process %s", res.WeightsSHA256[:16], want[:16])
	}
	if res.TestAccuracy <= 0 || res.Steps != 3 {
		t.Fatalf("result %+v", res)
	}
}

// A bad spec is refused before anything starts.
func TestCoordinatorRefusesBadSpecs(t *testing.T) {
	tc := newTestCluster(t, 2, &dataplane.Inmem{})
	cases := []struct {
		mod  func(*job.Spec)
		want string
	}{
		{func(s *job.Spec) { s.Model = "gpt5" }, "unknown model"},
		{func(s *job.Spec) { s.Partition = "fc1-fc8@a; fc10-fc32@b" }, "fc9"},
		{func(s *job.Spec) { s.Partition = "fc1-fc8@a; fc9-fc20@b; fc21-fc32@c" }, "c"},
		{func(s *job.Spec) { s.MicroBatches = 100 }, "micro-batches"},
		{func(s *job.Spec) { s.Width = 1e9 }, "width"},
		{func(s *job.Spec) { s.Batch, s.MicroBatches = 1<<30, 4 }, "batch"},
		{func(s *job.Spec) { s.SyntheticSamples = -5 }, "synthetic samples"},
	}
	for _, c := range cases {
		spec := smallSpec("mlp32")
		c.mod(&spec)
		_, err := NewCoordinator(spec, CoordinatorConfig{System: tc.systems[0], DataPlane: tc.dp, Nodes: tc.nodes, Threads: 1})
		if err == nil || !errors.Is(err, job.ErrSpec) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("spec %+v: error %v, want ErrSpec mentioning %q", spec, err, c.want)
		}
	}
}

// A node that dies mid-job is re-planned around: the job restores the
// latest cut on the live nodes, replays, and ends with the weights of the
// run without the failure.
func TestRecoveryFromANodeDeath(t *testing.T) {
	for _, dp := range []dataplane.DataPlane{&dataplane.Inmem{}, &dataplane.TCP{}} {
		t.Run(fmt.Sprintf("%T", dp), func(t *testing.T) {
			tc := newTestCluster(t, 3, dp)
			spec := smallSpec("mlp32")
			spec.ID = "recover"
			spec.Epochs, spec.Steps, spec.CheckpointEvery = 3, 9, 4
			spec.Partition, spec.Schedule = "uniform", "1f1b"
			want := localSHA(t, spec)
			killed := make(chan struct{})
			var once sync.Once
			c, err := NewCoordinator(spec, CoordinatorConfig{System: tc.systems[0], DataPlane: tc.dp, Nodes: tc.nodes, Threads: 1,
				Logger: slog.New(slog.DiscardHandler), OnStep: func(step int) {
					if step == 6 { // after the cut at step 4: steps 4 and 5 replay
						once.Do(func() {
							tc.systems[2].Stop()
							close(killed)
						})
					}
				}})
			if err != nil {
				t.Fatal(err)
			}
			res, err := c.Run(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			st := c.Status()
			select {
			case <-killed:
			default:
				t.Fatalf("the job ended without reaching step 6: %+v", st)
			}
			if len(st.Recoveries) != 1 {
				t.Fatalf("recoveries %+v, want one", st.Recoveries)
			}
			r := st.Recoveries[0]
			t.Logf("recovery: %+v", r)
			if r.Step != 6 || r.Replayed != 2 || strings.Contains(r.Plan, "@c") {
				t.Errorf("recovery at step %d replayed %d onto plan %q; want step 6, 2 replayed, no node c", r.Step, r.Replayed, r.Plan)
			}
			if res.WeightsSHA256 != want {
				t.Fatalf("weights after recovery %s, without failure %s", res.WeightsSHA256[:16], want[:16])
			}
		})
	}
}

// Stages whose coordinator vanishes (its links break without a StopStage)
// stop by themselves and free what they hold.
func TestStagesStopWhenTheCoordinatorIsGone(t *testing.T) {
	tc := newTestCluster(t, 3, &dataplane.TCP{})
	spec := smallSpec("mlp32")
	spec.ID, spec.Partition = "orphans", "uniform"
	c, err := NewCoordinator(spec, CoordinatorConfig{System: tc.systems[0], DataPlane: tc.dp, Nodes: tc.nodes, Threads: 1,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.start(); err != nil {
		t.Fatal(err)
	}
	// A watcher on each stage's node sees it terminate.
	stopped := make([]chan struct{}, len(c.pids))
	for k, pid := range c.pids {
		sys := tc.systems[slices.IndexFunc(tc.nodes, func(n job.NodeInfo) bool { return n.ActorAddr == pid.GetAddress() })]
		stopped[k] = make(chan struct{})
		sys.Actor.Root.Spawn(actor.PropsFromFunc(func(ctx actor.Context) {
			switch ctx.Message().(type) {
			case *actor.Started:
				ctx.Watch(pid)
			case *actor.Terminated:
				close(stopped[k])
			}
		}))
	}
	for _, lk := range c.links {
		lk.Close()
	}
	deadline := time.After(5 * time.Second)
	for k := range stopped {
		select {
		case <-stopped[k]:
		case <-deadline:
			t.Fatalf("stage %d still runs 5 s after its coordinator's links broke", k)
		}
	}
}

// A coordinator that takes a job over continues from its latest stored cut
// and ends with the weights of the uninterrupted run.
func TestCoordinatorResumesFromAStoredCut(t *testing.T) {
	tc := newTestCluster(t, 3, &dataplane.TCP{})
	spec := smallSpec("mlp32")
	spec.ID, spec.Partition, spec.Schedule = "takeover", "uniform", "gpipe"
	spec.Epochs, spec.Steps, spec.CheckpointEvery = 3, 9, 4
	want := localSHA(t, spec)
	store, err := tensorio.OpenStore(t.TempDir(), 2)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	first, err := NewCoordinator(spec, CoordinatorConfig{System: tc.systems[0], DataPlane: tc.dp, Nodes: tc.nodes, Threads: 1,
		Logger: slog.New(slog.DiscardHandler), Store: store, OnStep: func(step int) {
			if step == 6 {
				cancel() // the coordinator goes away after step 6; the cut is at step 4
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := first.Run(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("first coordinator: %v, want it cancelled", err)
	}
	ck, err := store.Latest(spec.ID, "")
	if err != nil {
		t.Fatal(err)
	}
	if ck.Step != 4 {
		t.Fatalf("latest stored cut at step %d, want 4", ck.Step)
	}
	second, err := NewCoordinator(spec, CoordinatorConfig{System: tc.systems[1], DataPlane: tc.dp, Nodes: tc.nodes[1:], Threads: 1,
		Logger: slog.New(slog.DiscardHandler), Resume: ck, Generation: 100})
	if err != nil {
		t.Fatal(err)
	}
	res, err := second.Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if res.WeightsSHA256 != want {
		t.Fatalf("weights after the takeover %s, uninterrupted %s", res.WeightsSHA256[:16], want[:16])
	}
	// A successor without any cut restarts the job, still above the
	// generations the nodes have seen (100), or they refuse its stages.
	third, err := NewCoordinator(spec, CoordinatorConfig{System: tc.systems[2], DataPlane: tc.dp, Nodes: tc.nodes[1:], Threads: 1,
		Logger: slog.New(slog.DiscardHandler), Generation: 200})
	if err != nil {
		t.Fatal(err)
	}
	if res, err = third.Run(context.Background()); err != nil {
		t.Fatalf("a restart without a cut: %v", err)
	}
	if res.WeightsSHA256 != want {
		t.Fatalf("weights after a restart %s, uninterrupted %s", res.WeightsSHA256[:16], want[:16])
	}
}

// A node that slows down mid-job (an emulated 4x slowdown from step 10) is
// given less work within 20 steps; the weights are those of the run
// without any plan change.
func TestRebalancesWhenANodeSlowsDown(t *testing.T) {
	if testing.Short() {
		t.Skip("trains 60 steps")
	}
	tc := newTestCluster(t, 3, &dataplane.TCP{})
	spec := smallSpec("mlp32")
	spec.ID, spec.Width, spec.Batch, spec.SyntheticSamples = "slow", 128, 48, 2880
	spec.Steps, spec.CheckpointEvery = 60, 10
	want := localSHA(t, spec)
	c, err := NewCoordinator(spec, CoordinatorConfig{System: tc.systems[0], DataPlane: tc.dp, Nodes: tc.nodes, Threads: 1,
		Logger: slog.New(slog.DiscardHandler), OnStep: func(step int) {
			if step == 10 {
				tc.hosts[2].SetSlowdown(4)
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	first := c.Plan()
	if len(first.Stages) < 2 {
		t.Skipf("the planner uses %d node(s) for this model here; nothing to rebalance", len(first.Stages))
	}
	res, err := c.Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	st := c.Status()
	t.Logf("first plan %s; replans %+v", res.Plan, st.Replans)
	if len(st.Replans) == 0 || st.Replans[0].Step > 30 {
		t.Fatalf("no re-plan within 20 steps of the slowdown: %+v", st.Replans)
	}
	if r := st.Replans[0]; r.MeasuredBeforeMS <= 0 || r.MeasuredAfterMS <= 0 {
		t.Errorf("re-plan at step %d of 60 without its measured step times: before %v ms, after %v ms", r.Step, r.MeasuredBeforeMS, r.MeasuredAfterMS)
	}
	if res.WeightsSHA256 != want {
		t.Fatalf("weights with re-plans %s, single process %s", res.WeightsSHA256[:16], want[:16])
	}
}

// A node whose speed flickers between two values every two steps makes at
// most one plan change.
func TestFlickeringSpeedReplansAtMostOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("trains 80 steps")
	}
	tc := newTestCluster(t, 3, &dataplane.TCP{})
	spec := smallSpec("mlp32")
	spec.ID, spec.Width, spec.Batch, spec.SyntheticSamples = "flicker", 128, 48, 3840
	spec.Steps, spec.CheckpointEvery = 80, 10
	c, err := NewCoordinator(spec, CoordinatorConfig{System: tc.systems[0], DataPlane: tc.dp, Nodes: tc.nodes, Threads: 1,
		Logger: slog.New(slog.DiscardHandler), OnStep: func(step int) {
			if step >= 10 {
				tc.hosts[2].SetSlowdown([]float64{1, 2}[(step/2)%2])
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	if st := c.Status(); len(st.Replans) > 1 {
		t.Fatalf("%d re-plans for a flickering node: %+v", len(st.Replans), st.Replans)
	}
}

// A fast node that joins mid-job is taken into the plan.
func TestUsesANodeThatJoins(t *testing.T) {
	if testing.Short() {
		t.Skip("trains 50 steps")
	}
	tc := newTestCluster(t, 3, &dataplane.TCP{})
	tc.hosts[0].SetSlowdown(3)
	tc.hosts[1].SetSlowdown(3)
	spec := smallSpec("mlp32")
	spec.ID, spec.Width, spec.Batch, spec.SyntheticSamples = "join", 128, 48, 2400
	spec.Steps, spec.CheckpointEvery = 50, 10
	want := localSHA(t, spec)
	var joined atomic.Bool
	c, err := NewCoordinator(spec, CoordinatorConfig{System: tc.systems[0], DataPlane: tc.dp, Nodes: tc.nodes[:2], Threads: 1,
		Logger: slog.New(slog.DiscardHandler),
		LiveNodes: func() []job.NodeInfo {
			if joined.Load() {
				return tc.nodes
			}
			return tc.nodes[:2]
		},
		OnStep: func(step int) { joined.Store(step >= 10) }})
	if err != nil {
		t.Fatal(err)
	}
	res, err := c.Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	st := c.Status()
	if len(st.Replans) == 0 || !strings.Contains(res.Plan, "@c") {
		t.Fatalf("the joined node c is not used: plan %s, replans %+v", res.Plan, st.Replans)
	}
	t.Logf("replans %+v", st.Replans)
	if res.WeightsSHA256 != want {
		t.Fatalf("weights with re-plans %s, single process %s", res.WeightsSHA256[:16], want[:16])
	}
}

// The automatic checkpoint interval keeps a cut's cost within 2% of the
// training time from the first cut on: until a cut is measured its cost
// is estimated from the state's size; a measured pause counts with the
// last writing and copying, or the estimate while that has not ended.
func TestAutomaticCheckpointInterval(t *testing.T) {
	const mb = 1_000_000
	ms := time.Millisecond
	for _, tc := range []struct {
		name           string
		state          int64
		pause, persist time.Duration
		measured       time.Duration
		persists       bool
		step           float64
		wantCost       time.Duration
		wantK          int
	}{
		{"before any cut: 66 MB at the assumed 25 MB/s", 66 * mb, 0, 0, 0, true, 0.2, 2640 * ms, 660},
		{"before any cut, small state", 1 * mb, 0, 0, 0, true, 0.01, 40 * ms, 200},
		{"first cut's pause measured, still persisting", 66 * mb, 200 * ms, 0, 0, true, 0.2, 2840 * ms, 710},
		{"pause and persist measured", 270 * mb, 200 * ms, 900 * ms, 0, true, 0.1, 1100 * ms, 550},
		{"its cost to the steps measured", 270 * mb, 200 * ms, 900 * ms, 2 * time.Second, true, 0.1, 2 * time.Second, 1000},
		{"nothing persists", 270 * mb, 200 * ms, 0, 0, false, 0.1, 200 * ms, 100},
		{"tiny cuts: at least 5 steps", 1000, 1 * ms, 1 * ms, 0, true, 1, 2 * ms, 5},
	} {
		got := cutCost(tc.state, tc.pause, tc.persist, tc.measured, tc.persists)
		if got != tc.wantCost {
			t.Errorf("%s: cost %v, want %v", tc.name, got, tc.wantCost)
		}
		if k := chooseK(got, tc.step); k != tc.wantK {
			t.Errorf("%s: K %d, want %d", tc.name, k, tc.wantK)
		}
	}
}

// A cut's cost is the time the steps from it took beyond the median step
// before it, counted until it has been written and copied.
func TestCutWindow(t *testing.T) {
	steps := []float64{0.1, 0.1, 0.1, 0.1}
	persisted := make(chan struct{})
	w := cutWindow{open: true, start: len(steps), med: 0.1, persisted: persisted}
	steps = append(steps, 0.4) // the cut's pause is in this step
	if _, ok := w.measure(steps); ok {
		t.Fatal("measured before the cut's persist ended")
	}
	steps = append(steps, 0.15, 0.08) // faster steps do not pay it back
	close(persisted)
	cost, ok := w.measure(steps)
	if !ok || cost != 350*time.Millisecond {
		t.Fatalf("cost %v %v, want 350ms", cost, ok)
	}
	if _, ok := w.measure(steps); ok {
		t.Fatal("measured twice")
	}
}

// When the nodes left after a failure cannot hold the model, the job
// pauses with a status that says so, and resumes from its latest cut once
// enough nodes are there, with the weights of the run without failure.
func TestPausesUntilNodesHoldTheModel(t *testing.T) {
	tc := newTestCluster(t, 3, &dataplane.Inmem{})
	spec := smallSpec("mlp32")
	spec.ID = "pause"
	spec.Epochs, spec.Steps, spec.CheckpointEvery = 3, 9, 4
	spec.Partition, spec.NoRebalance = "auto", true
	want := localSHA(t, spec)
	// What the whole model needs on one node; each node gets 70% of it,
	// so the job needs two.
	one, err := NewCoordinator(spec, CoordinatorConfig{System: tc.systems[0], DataPlane: tc.dp, Nodes: tc.nodes[:1], Threads: 1,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	need := one.Report().Stages[0].PeakMemory
	nodes := slices.Clone(tc.nodes)
	for i := range nodes {
		nodes[i].Memory = int64(0.7 * need)
	}
	a, b, c := nodes[0], nodes[1], nodes[2]
	// A new job that no node set can hold is a bad spec for the cluster.
	if _, err := NewCoordinator(spec, CoordinatorConfig{System: tc.systems[0], DataPlane: tc.dp, Nodes: []job.NodeInfo{a}, Threads: 1,
		Logger: slog.New(slog.DiscardHandler)}); !errors.Is(err, job.ErrSpec) || !errors.Is(err, balance.ErrNoFit) {
		t.Errorf("a job submitted to one node too small for it: %v; want ErrSpec wrapping balance.ErrNoFit", err)
	}
	var (
		mu     sync.Mutex
		live   = []job.NodeInfo{a, b}
		killed bool
		paused string // the job's state when the replacement arrives
		co     *Coordinator
	)
	cfg := CoordinatorConfig{System: tc.systems[0], DataPlane: tc.dp, Nodes: []job.NodeInfo{a, b}, Threads: 1,
		Logger: slog.New(slog.DiscardHandler),
		LiveNodes: func() []job.NodeInfo {
			mu.Lock()
			defer mu.Unlock()
			if st := co.Status(); killed && len(live) == 1 && paused == "" && st.State == job.StatePaused {
				// The recovery's first attempt found only a: c joins.
				paused = st.Reason
				live = []job.NodeInfo{a, c}
			}
			return slices.Clone(live)
		},
		OnStep: func(step int) {
			mu.Lock()
			defer mu.Unlock()
			if step == 6 && !killed {
				killed = true
				tc.systems[1].Stop()
				live = []job.NodeInfo{a}
			}
		}}
	co, err = NewCoordinator(spec, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(co.Status().Plan, "@b") {
		t.Fatalf("plan %s does not need b", co.Status().Plan)
	}
	res, err := co.Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	st := co.Status()
	t.Logf("paused as %q; recoveries %+v", paused, st.Recoveries)
	if !strings.HasPrefix(paused, "waiting for nodes: ") || !strings.Contains(paused, "fits") {
		t.Errorf("state while too few nodes hold the model: %q; want paused, saying what does not fit", paused)
	}
	if len(st.Recoveries) != 1 || !strings.Contains(st.Recoveries[0].Plan, "@c") {
		t.Errorf("recoveries %+v; want one, onto a and c", st.Recoveries)
	}
	if res.WeightsSHA256 != want {
		t.Fatalf("weights after the pause %s, without failure %s", res.WeightsSHA256[:16], want[:16])
	}
}
