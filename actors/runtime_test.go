package actors

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/ppnode/ppnode/balance"
	"github.com/ppnode/ppnode/dataplane"
	"github.com/ppnode/ppnode/job"
	"github.com/ppnode/ppnode/job/core"
	"github.com/ppnode/ppnode/job/jobtest"
	"github.com/ppnode/ppnode/nn"
	"github.com/ppnode/ppnode/tensorio"
	"google.golang.org/protobuf/proto"
)

// testCluster is n nodes in this process, each hosting stages: in memory
// (InmemControl and the Inmem data plane: no socket) or real (an actor
// System each, over protoactor remote, and TCP links).
type testCluster struct {
	hosts   []*StageHost
	ctl     Control
	inmem   *InmemControl // the in-memory cluster's control plane
	systems []*System     // the real cluster's
	nodes   []job.NodeInfo
	dp      dataplane.DataPlane
}

// newInmemCluster is n in-memory nodes on data plane dp (default Inmem).
func newInmemCluster(t testing.TB, n int, dp dataplane.DataPlane) *testCluster {
	t.Helper()
	if dp == nil {
		dp = &dataplane.Inmem{}
	}
	tc := &testCluster{inmem: &InmemControl{}, dp: dp}
	tc.ctl = tc.inmem
	quiet := slog.New(slog.DiscardHandler)
	for i := range n {
		host := &StageHost{DataPlane: dp, Threads: 1, Logger: quiet}
		addr := fmt.Sprintf("node-%c:1", 'a'+i)
		tc.inmem.AddNode(addr, host)
		tc.hosts = append(tc.hosts, host)
		tc.nodes = append(tc.nodes, job.NodeInfo{Name: string(rune('a' + i)), ActorAddr: addr})
	}
	t.Cleanup(func() {
		for _, n := range tc.nodes {
			tc.inmem.Kill(n.ActorAddr)
		}
	})
	return tc
}

// newSystemCluster is n nodes with an actor System each on data plane dp.
func newSystemCluster(t testing.TB, n int, dp dataplane.DataPlane) *testCluster {
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
	tc.ctl = tc.systems[0]
	return tc
}

// kill makes node i die, as a killed process would.
func (tc *testCluster) kill(i int) {
	if tc.inmem != nil {
		tc.inmem.Kill(tc.nodes[i].ActorAddr)
		return
	}
	tc.systems[i].Stop()
}

func (tc *testCluster) config(nodes int) CoordinatorConfig {
	return CoordinatorConfig{Control: tc.ctl, DataPlane: tc.dp, Nodes: tc.nodes[:nodes], Threads: 1, Logger: slog.New(slog.DiscardHandler)}
}

func (tc *testCluster) run(t testing.TB, spec job.Spec, nodes int) (*job.Result, *Coordinator) {
	t.Helper()
	return runJob(t, spec, tc.config(nodes), nil)
}

// runJob plans spec with cfg and runs it to its end; bind, if set, gets
// the coordinator before it runs (for cfg.OnStep to act on).
func runJob(t testing.TB, spec job.Spec, cfg CoordinatorConfig, bind **Coordinator) (*job.Result, *Coordinator) {
	t.Helper()
	c, err := newCoordinator(spec, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if bind != nil {
		*bind = c
	}
	res, err := c.Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return res, c
}

func smallSpec(model string) job.Spec {
	s := jobtest.SmallSpec()
	s.ID = "job-" + model
	s.Model = model
	switch model {
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

func localSHA(t *testing.T, spec job.Spec) string { return jobtest.LocalSHA(t, spec) }

// newCoordinator checks spec and makes its coordinator, as a node does
// with a job submitted to it.
func newCoordinator(spec job.Spec, cfg CoordinatorConfig) (*Coordinator, error) {
	c, err := job.Check(spec)
	if err != nil {
		return nil, err
	}
	return NewCoordinator(c, cfg)
}

// waitStatus waits until the job's status satisfies cond, or fails the
// test after timeout.
func waitStatus(t *testing.T, c *Coordinator, timeout time.Duration, what string, cond func(job.Status) bool) job.Status {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		changed := c.Changed()
		if st := c.Status(); cond(st) {
			return st
		}
		select {
		case <-changed:
		case <-deadline.C:
			t.Fatalf("%s: not within %v; status %+v", what, timeout, c.Status())
		}
	}
}

// A pipelined job across nodes gives the weights of one process, bit for
// bit, for every model, schedule and partition tried, with stages that
// recompute their activations too (vgg16: dropout and BatchNorm).
func TestPipelinedJobIsBitIdentical(t *testing.T) {
	tc := newInmemCluster(t, 4, nil)
	cases := []struct {
		model, partition, schedule string
		nodes                      int
		recompute                  string
		chunks                     int
	}{
		{"mlp32", "uniform", "1f1b", 3, "all", 0},
		{"mlp32", "fc1-fc16@b; fc17-fc32@a", "gpipe", 2, "all", 0},
		{"vgg16", "uniform", "1f1b", 3, "all", 0},
		{"mlp32", "uniform", "zb", 3, "", 0},
		{"mlp32", "fc1-fc3@a; fc4-fc20@b; fc21-fc30@c; fc31-fc32@d", "zb", 4, "", 0},
		{"resnet50", "uniform", "zb", 3, "", 0},
		{"mlp32", "auto", "auto", 1, "", 0},
		{"mlp32", "uniform", "gpipe", 2, "", 0},
		{"mlp32", "uniform", "1f1b", 3, "", 0},
		{"mlp32", "fc1-fc3@a; fc4-fc20@b; fc21-fc30@c; fc31-fc32@d", "1f1b", 4, "", 0},
		{"mlp32", "fc1-fc16@b; fc17-fc32@a", "gpipe", 2, "", 0},
		{"uno", "flatten + tower3.slice-tower3.fc3@a; tower2.slice-tower2.fc3@b; tower1.slice-tower1.fc3@c; concat-out@d", "graph", 4, "", 0},
		{"resnet50", "uniform", "1f1b", 3, "", 0},
		{"vgg16", "auto", "auto", 2, "", 0},
		{"mlp32", "fc1-fc12@a,b; fc13-fc32@c", "1f1b", 3, "", 0},
		{"mlp32", "fc1-fc20@a; fc21-fc32@b:1,c:2,d:1", "gpipe", 4, "", 0},
		{"uno", "flatten + tower3.slice-tower3.fc3@a; tower2.slice-tower2.fc3@b,c; tower1.slice-tower1.fc3 + concat-out@d", "graph", 4, "", 0},
		{"mlp32", "fc1-fc12@a,b; fc13-fc32@c", "1f1b", 3, "all", 0},
		{"mlp32", "auto", "interleaved", 2, "", 2},
		{"mlp32", "uniform", "interleaved", 4, "", 2},
		{"mlp32", "fc1-fc5@a; fc6-fc10@b; fc11-fc16@a; fc17-fc22@b; fc23-fc27@a; fc28-fc32@b", "interleaved", 2, "", 0},
		{"mlp32", "auto", "interleaved", 2, "", 0},
	}
	if testing.Short() {
		all := cases
		cases = append(all[0:1:1], all[3], all[7], all[8], all[9], all[18], all[19])
	}
	want := map[string]*job.Result{}
	for _, c := range cases {
		t.Run(fmt.Sprintf("%s/%s/%s/%d/%s/%d", c.model, c.partition, c.schedule, c.nodes, c.recompute, c.chunks), func(t *testing.T) {
			spec := smallSpec(c.model)
			spec.Partition, spec.Schedule, spec.Recompute, spec.Chunks = c.partition, c.schedule, c.recompute, c.chunks
			if want[c.model] == nil {
				want[c.model] = jobtest.Local(t, spec)
			}
			spec.ID = strings.NewReplacer(" ", "", ";", "_", "@", "_", "/", "-", ".", "-", "+", "-").Replace(t.Name())
			res, co := tc.run(t, spec, c.nodes)
			t.Logf("plan %s (%s, M=%d), stages %d, loss %.4f", res.Plan, res.Schedule, res.MicroBatches, len(co.Plan().Stages), res.TrainLoss)
			if res.Schedule != c.schedule && c.schedule == "zb" {
				t.Fatalf("schedule %s, want zb", res.Schedule)
			}
			if p := co.Plan(); c.schedule == "interleaved" && (p.Schedule != balance.Interleaved || p.Chunks < 2 || c.chunks > 0 && p.Chunks != c.chunks ||
				len(p.Stages) != c.nodes*p.Chunks || res.Schedule != fmt.Sprintf("interleaved (%d chunks per node)", p.Chunks)) {
				t.Fatalf("schedule %q, %s with %d chunks and %d stages, want interleaved with %d chunks on %d nodes", res.Schedule, p.Schedule, p.Chunks, len(p.Stages), c.chunks, c.nodes)
			}
			for _, st := range co.Plan().Stages {
				if st.Recompute != (c.recompute == "all") {
					t.Fatalf("stage %d recomputes %v under --recompute %q", st.ID, st.Recompute, c.recompute)
				}
			}
			local := want[c.model]
			if res.WeightsSHA256 != local.WeightsSHA256 {
				t.Fatalf("pipelined weights %s, single process %s", res.WeightsSHA256[:16], local.WeightsSHA256[:16])
			}
			// The stages evaluate the test split in the chunks and order of one process.
			if res.TestAccuracy != local.TestAccuracy || math.Float64bits(res.TestLoss) != math.Float64bits(local.TestLoss) || res.EvaluatedOn != "stages" {
				t.Fatalf("test accuracy %v and loss %v on the %s, single process %v and %v", res.TestAccuracy, res.TestLoss, res.EvaluatedOn, local.TestAccuracy, local.TestLoss)
			}
			checkPasses(t, co)
		})
	}
}

// checkPasses checks the newest step's passes in co's status: each stage
// ran the update and then its program's compute instructions in order,
// one at a time, and they add up to its forward and backward times; the
// simulator's passes are there for every stage.
func checkPasses(t *testing.T, co *Coordinator) {
	t.Helper()
	st, plan := co.Status(), co.Plan()
	if len(st.LastSteps) == 0 {
		t.Fatal("no last steps")
	}
	if len(st.Passes) != len(plan.Stages) || len(st.PredictedPasses) != len(plan.Stages) {
		t.Fatalf("passes for %d stages, predicted for %d, the plan has %d", len(st.Passes), len(st.PredictedPasses), len(plan.Stages))
	}
	newest := st.LastSteps[len(st.LastSteps)-1]
	for k, sp := range plan.Stages {
		want := []string{"step 0"}
		for _, in := range sp.Program {
			switch in.Op {
			case balance.OpForward, balance.OpLoss, balance.OpBackward, balance.OpBackwardInput, balance.OpWeight, balance.OpRecompute:
				want = append(want, fmt.Sprintf("%s %d", in.Op, in.Micro))
			}
		}
		sg := newest.Stages[k]
		var got []string
		var fwd, bwd, upd, end float64
		for _, p := range st.Passes[k] {
			got = append(got, fmt.Sprintf("%s %d", p.Op, p.Micro))
			if p.StartMS < end-1e-3 || p.MS < 0 {
				t.Errorf("stage %d: %s %d at %.3f ms for %.3f ms, before the pass before it ended at %.3f", k, p.Op, p.Micro, p.StartMS, p.MS, end)
			}
			end = p.StartMS + p.MS
			switch p.Op {
			case "forward", "loss", "recompute":
				fwd += p.MS
			case "step":
				upd += p.MS
			default:
				bwd += p.MS
			}
		}
		if !slices.Equal(got, want) {
			t.Fatalf("stage %d ran %v, its program %v", k, got, want)
		}
		if end > sg.WallMS+1e-3 {
			t.Errorf("stage %d: passes end at %.3f ms, its step at %.3f", k, end, sg.WallMS)
		}
		// Each figure is rounded to the microsecond.
		tol := 1e-3 * float64(len(got)+1)
		if math.Abs(fwd-sg.ForwardMS) > tol || math.Abs(bwd-sg.BackwardMS) > tol || math.Abs(upd-sg.UpdateMS) > tol {
			t.Errorf("stage %d: passes add up to forward %.3f backward %.3f update %.3f ms, the stage measured %.3f %.3f %.3f",
				k, fwd, bwd, upd, sg.ForwardMS, sg.BackwardMS, sg.UpdateMS)
		}
	}
}

// The same over protoactor remote and TCP links.
func TestPipelinedJobOverTCP(t *testing.T) {
	tc := newSystemCluster(t, 3, &dataplane.TCP{})
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

// Interleaved 1F1B over protoactor remote and TCP links: two chunks of a
// node are two stage actors taking turns in the node's order.
func TestInterleavedJobOverTCP(t *testing.T) {
	tc := newSystemCluster(t, 2, &dataplane.TCP{})
	spec := smallSpec("mlp32")
	spec.ID, spec.Schedule, spec.Chunks = "job-interleaved-tcp", "interleaved", 2
	want := localSHA(t, spec)
	res, co := tc.run(t, spec, 2)
	if p := co.Plan(); p.Schedule != balance.Interleaved || len(p.Stages) != 4 {
		t.Fatalf("plan %s with %d stages", p.Schedule, len(p.Stages))
	}
	if st := co.Status(); st.Schedule != "interleaved (2 chunks per node)" {
		t.Errorf("status shows the schedule as %q", st.Schedule)
	}
	if res.WeightsSHA256 != want {
		t.Fatalf("pipelined weights %s, single process %s", res.WeightsSHA256[:16], want[:16])
	}
}

// A bad spec is refused before anything starts.
func TestCoordinatorRefusesBadSpecs(t *testing.T) {
	tc := newInmemCluster(t, 2, nil)
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
		{func(s *job.Spec) { s.ID = "" }, "no job id"},
		{func(s *job.Spec) { s.Partition = "fc1-fc16@a,b; fc17-fc32@a" }, "two stages"},
	}
	for _, c := range cases {
		spec := smallSpec("mlp32")
		c.mod(&spec)
		_, err := newCoordinator(spec, tc.config(2))
		if err == nil || !errors.Is(err, job.ErrSpec) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("spec %+v: error %v, want ErrSpec mentioning %q", spec, err, c.want)
		}
	}
}

// A node that dies mid-job is re-planned around and the job ends with the
// weights of the run without the failure. Without replicas the job
// restores the latest cut on the live nodes and replays; when the dead
// node ran a replica, the stage's other replica holds the same state,
// which moves to a plan over the nodes left, and only the failed step runs
// again. In memory the step notices (its links break); over TCP the
// cluster reports it first, as memberlist would (a dead system's port may
// be taken by another process at once, which answers the recovery's
// probe).
func TestRecoveryFromANodeDeath(t *testing.T) {
	clusters := []struct {
		name   string
		make   func(t *testing.T) *testCluster
		report bool
	}{
		{"inmem", func(t *testing.T) *testCluster { return newInmemCluster(t, 3, nil) }, false},
		{"tcp", func(t *testing.T) *testCluster { return newSystemCluster(t, 3, &dataplane.TCP{}) }, true},
	}
	plans := []struct {
		name, partition string
		dead            int
		// want: where the state came from, the steps replayed (the cut is
		// at step 4, the failure at step 6) and the plan after.
		from     string
		replayed int
		plan     func(string) bool
	}{
		{"cut", "uniform", 2, job.FromCut, 2, func(p string) bool { return !strings.Contains(p, "@c") }},
		{"replica", "fc1-fc12@a,b; fc13-fc32@c", 1, job.FromSurvivors, 0, func(p string) bool { return p == "fc1-fc12@a; fc13-fc32@c" }},
	}
	for _, pc := range plans {
		for _, tc := range clusters {
			t.Run(pc.name+"/"+tc.name, func(t *testing.T) {
				cl := tc.make(t)
				spec := smallSpec("mlp32")
				spec.ID = "recover"
				spec.Epochs, spec.Steps, spec.CheckpointEvery = 3, 9, 4
				spec.Partition, spec.Schedule = pc.partition, "1f1b"
				spec.ClipGradNorm = 0.05 // the updates wait for the coordinator's scale
				want := localSHA(t, spec)
				var once sync.Once
				var c *Coordinator
				cfg := cl.config(3)
				cfg.OnStep = func(step int) {
					if step == 6 {
						once.Do(func() {
							if tc.report {
								c.NodeFailed(cl.nodes[pc.dead].Name)
							}
							cl.kill(pc.dead)
						})
					}
				}
				res, _ := runJob(t, spec, cfg, &c)
				st := c.Status()
				if len(st.Recoveries) != 1 {
					t.Fatalf("recoveries %+v, want one", st.Recoveries)
				}
				r := st.Recoveries[0]
				t.Logf("recovery: %+v", r)
				if r.Step != 6 || r.From != pc.from || r.Replayed != pc.replayed || !pc.plan(r.Plan) {
					t.Errorf("recovery at step %d from the %s, %d replayed, onto plan %q; want step 6 from the %s, %d replayed, without node %s",
						r.Step, r.From, r.Replayed, r.Plan, pc.from, pc.replayed, cl.nodes[pc.dead].Name)
				}
				if res.WeightsSHA256 != want {
					t.Fatalf("weights after recovery %s, without failure %s", res.WeightsSHA256[:16], want[:16])
				}
			})
		}
	}
}

// Without --deterministic replicas run interleaved micro-batches and sum
// their gradients after their last backward pass, passing each tensor on
// as soon as it is added: the weights then differ from one process's only
// in the order of the additions (with the deterministic GEMM, nothing
// else differs), within float32 rounding.
func TestFastSumsTrainAsOneProcess(t *testing.T) {
	tc := newInmemCluster(t, 4, nil)
	spec := smallSpec("mlp32")
	spec.ID, spec.Deterministic, spec.Backend, spec.Optimizer, spec.Steps = "fast-sums", false, "ppnode-det", "sgd", 3
	spec.Partition, spec.Schedule = "fc1-fc12@a,b,c; fc13-fc32@d", "gpipe"
	j, err := jobtest.Check(t, spec).Prepare()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := j.TrainLocal(1, job.LocalHooks{}); err != nil {
		t.Fatal(err)
	}
	want := map[string][]float32{}
	for _, p := range j.Graph.Params() {
		want[p.Name] = slices.Clone(nn.F32(p.Value))
	}
	_, co := tc.run(t, spec, 4)
	if !co.Plan().Replicated() || co.Plan().ChainedSums {
		t.Fatalf("plan %s: want replicas with sums in the fast order", co.Describe())
	}
	var worst float64
	for _, p := range co.final.params {
		for i, v := range nn.F32(p.Value) {
			worst = max(worst, math.Abs(float64(v-want[p.Name][i])))
		}
	}
	t.Logf("largest difference from one process: %g", worst)
	if worst == 0 || worst > 1e-5 {
		t.Fatalf("weights differ from one process's by up to %g, want (0, 1e-5]: the sums are in another order, no more", worst)
	}
}

// Stages whose coordinator vanishes (its links break without a StopStage)
// stop by themselves and free what they hold.
func TestStagesStopWhenTheCoordinatorIsGone(t *testing.T) {
	tc := newInmemCluster(t, 3, nil)
	_, s, _ := startUniform(t, tc, "orphans")
	for _, lk := range s.links {
		lk.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for i, h := range tc.hosts {
		if err := h.WaitIdle(ctx); err != nil {
			t.Fatalf("node %s still runs stages 5 s after their coordinator's links broke", tc.nodes[i].Name)
		}
	}
}

// A coordinator that takes a job over continues from its latest stored cut
// (as replicated beyond the first coordinator's node) and ends with the
// weights of the uninterrupted run; one without a cut restarts it.
func TestCoordinatorResumesFromAStoredCut(t *testing.T) {
	tc := newInmemCluster(t, 3, nil)
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
	cfg := tc.config(3)
	replicas := &InmemReplicas{}
	cfg.Store, cfg.Replicas = store, replicas
	cfg.OnStep = func(step int) {
		if step == 6 {
			cancel() // the coordinator goes away after step 6; the cut is at step 4
		}
	}
	first, err := newCoordinator(spec, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := first.Run(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("first coordinator: %v, want it cancelled", err)
	}
	ck, err := store.Latest(spec.ID)
	if err != nil {
		t.Fatal(err)
	}
	if ck.Step != 4 {
		t.Fatalf("latest stored cut at step %d, want 4", ck.Step)
	}
	if ck, err = replicas.Latest(spec.ID); err != nil || ck == nil || ck.Step != 4 {
		t.Fatalf("latest replica: %v (%v), want the cut at step 4", ck, err)
	}
	cfg = tc.config(3)
	cfg.Nodes, cfg.Resume, cfg.Generation, cfg.Takeover = tc.nodes[1:], ck, 100, true
	res, _ := runJob(t, spec, cfg, nil)
	if res.WeightsSHA256 != want {
		t.Fatalf("weights after the takeover %s, uninterrupted %s", res.WeightsSHA256[:16], want[:16])
	}
	// A successor without any cut restarts the job, still above the
	// generations the nodes have seen (100), or they refuse its stages.
	cfg.Resume, cfg.Generation = nil, 200
	if res, _ = runJob(t, spec, cfg, nil); res.WeightsSHA256 != want {
		t.Fatalf("weights after a restart %s, uninterrupted %s", res.WeightsSHA256[:16], want[:16])
	}
	// Below the generations they have seen, the nodes refuse.
	cfg.Generation = 150
	fourth, err := newCoordinator(spec, cfg)
	if err != nil {
		t.Fatal(err)
	}
	var se *SpawnError
	if _, err := fourth.Run(context.Background()); !errors.As(err, &se) || se.Status != SpawnStatus_SPAWN_STATUS_STALE {
		t.Fatalf("a coordinator of an older generation: %v, want a stale spawn", err)
	}
}

// A node that joins mid-job, faster than the job's nodes, is taken into
// the plan (trigger "joined"), the state moving to it directly; the
// weights are those of the run without any plan change.
func TestUsesANodeThatJoins(t *testing.T) {
	tc := newInmemCluster(t, 3, nil)
	// a and b count as a tenth of the reference's speed, c as the
	// reference: measured speeds are capped at 1.25 times the start-up
	// GEMM speed, so a and b stay slow.
	for i := range tc.nodes {
		tc.nodes[i].GFLOPS = 1
	}
	tc.nodes[2].GFLOPS = 10
	spec := smallSpec("mlp32")
	spec.ID, spec.Width, spec.Batch, spec.SyntheticSamples = "join", 128, 48, 2400
	spec.Steps, spec.CheckpointEvery = 50, 10
	want := localSHA(t, spec)
	var c *Coordinator
	var once sync.Once
	cfg := tc.config(2)
	cfg.GFLOPS = 10
	cfg.OnStep = func(step int) {
		if step >= 10 {
			once.Do(func() { c.Members(tc.nodes) })
		}
	}
	res, _ := runJob(t, spec, cfg, &c)
	st := c.Status()
	t.Logf("replans %+v", st.Replans)
	if len(st.Replans) == 0 || st.Replans[0].Trigger != job.TriggerJoined || !strings.Contains(res.Plan, "@c") {
		t.Fatalf("the joined node c is not used: plan %s, replans %+v", res.Plan, st.Replans)
	}
	if r := st.Replans[0]; r.Method != "direct" || r.MovedBytes == 0 {
		t.Errorf("re-plan %+v: want the state moved directly", r)
	}
	if res.WeightsSHA256 != want {
		t.Fatalf("weights with re-plans %s, single process %s", res.WeightsSHA256[:16], want[:16])
	}
}

// When the nodes left after a failure cannot hold the model, the job
// pauses with a status that says so, and resumes from its latest cut once
// enough nodes are there, with the weights of the run without failure.
func TestPausesUntilNodesHoldTheModel(t *testing.T) {
	tc := newInmemCluster(t, 3, nil)
	spec := smallSpec("mlp32")
	spec.ID = "pause"
	spec.Epochs, spec.Steps, spec.CheckpointEvery = 3, 9, 4
	// One schedule: "auto" picks one by measured speeds, and with GPipe
	// (every micro-batch in flight) the stages may not fit.
	spec.Partition, spec.Schedule, spec.NoRebalance = "auto", "1f1b", true
	want := localSHA(t, spec)
	// What the whole model needs on one node; each node gets 70% of it,
	// so the job needs two.
	one, err := newCoordinator(spec, tc.config(1))
	if err != nil {
		t.Fatal(err)
	}
	need := one.Report().Stages[0].PeakMemory
	for i := range tc.nodes {
		tc.nodes[i].Memory = int64(0.7 * need)
	}
	a, b, c := tc.nodes[0], tc.nodes[1], tc.nodes[2]
	// A new job that no node set can hold is a bad spec for the cluster.
	if _, err := newCoordinator(spec, tc.config(1)); !errors.Is(err, job.ErrSpec) || !errors.Is(err, balance.ErrNoFit) {
		t.Errorf("a job submitted to one node too small for it: %v; want ErrSpec wrapping balance.ErrNoFit", err)
	}
	var co *Coordinator
	var once sync.Once
	cfg := tc.config(2)
	cfg.OnStep = func(step int) {
		if step == 6 {
			once.Do(func() {
				co.NodeFailed(b.Name)
				tc.kill(1)
			})
		}
	}
	co, err = newCoordinator(spec, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(co.Status().Plan, "@b") {
		t.Fatalf("plan %s does not need b", co.Status().Plan)
	}
	type result struct {
		res *job.Result
		err error
	}
	done := make(chan result, 1)
	go func() {
		res, err := co.Run(context.Background())
		done <- result{res, err}
	}()
	paused := waitStatus(t, co, 30*time.Second, "paused", func(st job.Status) bool { return st.State == job.StatePaused })
	if !strings.HasPrefix(paused.Reason, "waiting for nodes: ") || !strings.Contains(paused.Reason, "fits") {
		t.Errorf("state while too few nodes hold the model: %s %q; want paused, saying what does not fit", paused.State, paused.Reason)
	}
	co.Members([]job.NodeInfo{a, c})
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	st := co.Status()
	t.Logf("recoveries %+v", st.Recoveries)
	if len(st.Recoveries) != 1 || !strings.Contains(st.Recoveries[0].Plan, "@c") {
		t.Fatalf("recoveries %+v; want one, onto a plan with c", st.Recoveries)
	}
	if r.res.WeightsSHA256 != want {
		t.Fatalf("weights after the pause %s, without failure %s", r.res.WeightsSHA256[:16], want[:16])
	}
}

// hookControl calls before for every message sent through it.
type hookControl struct {
	Control
	before func(to StageRef, msg proto.Message)
}

func (h hookControl) Request(to StageRef, msg proto.Message, timeout time.Duration) (proto.Message, error) {
	h.before(to, msg)
	return h.Control.Request(to, msg, timeout)
}

func (h hookControl) Send(to StageRef, msg proto.Message) error {
	h.before(to, msg)
	return h.Control.Send(to, msg)
}

func nodeNames(ns []job.NodeInfo) []string {
	var out []string
	for _, n := range ns {
		out = append(out, n.Name)
	}
	return out
}

// A host that closes stops the stages it runs and sets up no new one: a
// plan that places a stage there fails with the reason.
func TestHostCloseStopsItsStages(t *testing.T) {
	tc := newInmemCluster(t, 3, nil)
	c, s, start := startUniform(t, tc, "closing")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for i, h := range tc.hosts {
		if err := h.Close(ctx); err != nil {
			t.Fatalf("node %s: Close: %v", tc.nodes[i].Name, err)
		}
	}
	c.stopStages(s, true)
	start.Gen = 2
	_, _, err := c.startStages(context.Background(), start)
	if err == nil || !strings.Contains(err.Error(), errHostClosing.Error()) {
		t.Fatalf("stages on closed hosts: err %v, want %q", err, errHostClosing)
	}
}

// startUniform plans mlp32 uniformly over tc's nodes as job id and starts
// the plan's stages (generation 1) without running the job.
func startUniform(t *testing.T, tc *testCluster, id string) (*Coordinator, *stageSet, core.StartStages) {
	t.Helper()
	c, start := planUniform(t, tc, id, tc.config(len(tc.nodes)))
	s, _, err := c.startStages(context.Background(), start)
	if err != nil {
		t.Fatal(err)
	}
	return c, s, start
}

// planUniform plans mlp32 uniformly over tc's nodes as job id, with cfg,
// and returns the coordinator and the start of the plan's stages.
func planUniform(t *testing.T, tc *testCluster, id string, cfg CoordinatorConfig) (*Coordinator, core.StartStages) {
	t.Helper()
	spec := smallSpec("mlp32")
	spec.ID, spec.Partition = id, "uniform"
	c, err := newCoordinator(spec, cfg)
	if err != nil {
		t.Fatal(err)
	}
	plan := c.Plan()
	start := core.StartStages{Gen: 1, Plan: plan, Addrs: make([]string, len(plan.Stages))}
	for k, sp := range plan.Stages {
		start.Addrs[k] = tc.nodes[slices.IndexFunc(tc.nodes, func(n job.NodeInfo) bool { return n.Name == sp.Node })].ActorAddr
	}
	return c, start
}

// The in-memory Replicator keeps what it is given as a checkpoint file
// holds it, and refuses what could not be written.
func TestInmemReplicas(t *testing.T) {
	var r InmemReplicas
	if ck, err := r.Latest("j"); ck != nil || err != nil {
		t.Fatalf("latest of nothing: %v, %v", ck, err)
	}
	w := nn.New(2)
	nn.F32(w)[1] = 3
	ck := &tensorio.Checkpoint{JobID: "j", Step: 4, Params: []tensorio.Named{{Name: "w", T: w}}, Meta: job.CutMeta{Generation: 2}.Encode()}
	if err := r.Replicate(ck); err != nil {
		t.Fatal(err)
	}
	nn.F32(w)[1] = 5 // the coordinator's model goes on
	got, err := r.Latest("j")
	if err != nil || got.Step != 4 || nn.F32(got.Params[0].T)[1] != 3 || got.Meta["generation"] != "2" {
		t.Fatalf("latest: %+v (%v)", got, err)
	}
	if err := r.Replicate(&tensorio.Checkpoint{JobID: "../x"}); err == nil {
		t.Error("a cut that cannot be written was kept")
	}
}

// slowSpawn holds every spawn until release is closed, as a node whose
// spawner never answers would, and reports the stops sent.
type slowSpawn struct {
	Control
	release chan struct{}
	stops   chan StageRef
}

func (s slowSpawn) Spawn(addr string, req *SpawnStage, timeout time.Duration) (StageRef, error) {
	<-s.release
	return s.Control.Spawn(addr, req, timeout)
}

func (s slowSpawn) Send(to StageRef, msg proto.Message) error {
	if _, ok := msg.(*StopStage); ok {
		s.stops <- to
	}
	return s.Control.Send(to, msg)
}

// Starting stages gives up when its operation is cancelled (a job
// cancelled while it re-plans ends at once, not after the control
// timeout); a stage whose spawn answers after that is stopped.
func TestStartStagesFollowsItsContext(t *testing.T) {
	tc := newInmemCluster(t, 3, nil)
	cfg := tc.config(len(tc.nodes))
	slow := slowSpawn{Control: cfg.Control, release: make(chan struct{}), stops: make(chan StageRef, 3)}
	cfg.Control = slow
	c, start := planUniform(t, tc, "slow-spawn", cfg)
	plan := start.Plan
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, _, err := c.startStages(ctx, start)
		done <- err
	}()
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled start: %v", err)
	}
	close(slow.release)
	for k := range plan.Stages { // each late stage is stopped
		select {
		case <-slow.stops:
		case <-time.After(testTimeout):
			t.Fatalf("%d of %d late stages stopped", k, len(plan.Stages))
		}
	}
}
