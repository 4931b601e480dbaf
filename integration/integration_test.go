package integration

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ppnode/ppnode/job"
	"github.com/ppnode/ppnode/nodes"
)

func TestMain(m *testing.M) {
	if runtime.GOOS != "linux" {
		fmt.Println("integration: skipping, the harness reads /proc and needs Linux")
		os.Exit(0)
	}
	code := m.Run()
	if kids := ChildProcesses(); len(kids) > 0 {
		fmt.Printf("leak: child processes left after the tests: %v\n", kids)
		code = 1
	}
	if build.path != "" {
		if ps := ProcessesOf(build.path); len(ps) > 0 {
			fmt.Printf("leak: processes of the tests' ppnode binary left: %v\n", ps)
			code = 1
		}
	}
	RemoveBinary()
	removeCreds()
	os.Exit(code)
}

// small is the training part of every exactness job: a few steps of a
// narrow mlp32 on synthetic data, deterministic, one thread per node.
var small = []string{"--deterministic", "--model", "mlp32", "--width", "32", "--data", "synthetic:8x8x1:4",
	"--synthetic-samples", "256", "--batch", "32", "--micro-batches", "4", "--steps", "6", "--threads", "1"}

// smallUno is the same for the multi-tower model, planned as a graph.
var smallUno = []string{"--deterministic", "--model", "uno", "--width", "0.05", "--data", "synthetic:8x8x1:4",
	"--synthetic-samples", "256", "--batch", "32", "--micro-batches", "4", "--steps", "6", "--threads", "1"}

// A job through the cluster gives the weights of one process, bit for
// bit, on 1 to 4 nodes, with GPipe and 1F1B, automatic and hand-written
// partitions. The cluster grows one node at a time and runs each size's
// cases.
func TestExactness(t *testing.T) {
	t.Parallel()
	type job struct {
		partition, schedule string
		stages              int // nodes the job runs on; 0: the plan decides
		uno                 bool
	}
	bySize := [][]job{
		1: {{"auto", "auto", 0, false}},
		2: {
			{"fc1-fc16@b; fc17-fc32@a", "gpipe", 2, false},
			{"uniform", "1f1b", 2, false},
			{"auto", "auto", 0, false},
			{"auto", "interleaved", 2, false},
		},
		3: {
			{"uniform", "gpipe", 3, false},
			{"fc1-fc8@a; fc9-fc20@b; fc21-fc32@c", "1f1b", 3, false},
		},
		4: {
			{"fc1-fc3@a; fc4-fc20@b; fc21-fc30@c; fc31-fc32@d", "1f1b", 4, false},
			{"uniform", "gpipe", 4, false},
			{"auto", "auto", 0, false},
			{"uniform", "interleaved", 4, false},
			{"flatten + tower3.slice-tower3.fc3@a; tower2.slice-tower2.fc3@b; tower1.slice-tower1.fc3@c; concat-out@d", "graph", 4, true},
			{"auto", "auto", 0, true},
		},
	}
	if testing.Short() {
		bySize = [][]job{
			1: {{"auto", "auto", 0, false}},
			2: {{"fc1-fc16@b; fc17-fc32@a", "gpipe", 2, false}, {"auto", "interleaved", 2, false}},
			3: {{"uniform", "1f1b", 3, false}},
		}
	}
	want := map[bool]string{}
	for _, uno := range []bool{false, true} {
		args := small
		if uno {
			args = smallUno
		}
		r, err := Train(t, 0, append([]string{"--local"}, args...)...)
		if err != nil {
			t.Fatal(err)
		}
		want[uno] = r.WeightsSHA256
	}
	c := NewCluster(t)
	for size := 1; size < len(bySize); size++ {
		c.Join(NodeOptions{Name: string(rune('a' + size - 1)), Threads: 1})
		waitMembers(t, c.Node("a"), size)
		for _, j := range bySize[size] {
			model := "mlp32"
			args := small
			if j.uno {
				model, args = "uno", smallUno
			}
			name := fmt.Sprintf("nodes=%d/%s/%s/%s", size, model, j.schedule, strings.NewReplacer(" ", "", ";", ",").Replace(j.partition))
			// Any node takes jobs: submit through the newest.
			via := c.Nodes()[size-1]
			t.Run(name, func(t *testing.T) {
				start := time.Now()
				// A job takes about half a second here.
				r, err := Train(t, 30*time.Second, append([]string{"--via", via.HTTP, "--partition", j.partition, "--schedule", j.schedule}, args...)...)
				if err != nil {
					t.Fatal(err)
				}
				t.Logf("plan %q, schedule %s, nodes %v, %.1f s", r.Plan, r.Schedule, r.Nodes, time.Since(start).Seconds())
				if r.WeightsSHA256 != want[j.uno] {
					t.Errorf("weights %s through the cluster, %s in one process", r.WeightsSHA256, want[j.uno])
				}
				if j.stages > 0 && len(r.Nodes) != j.stages {
					t.Errorf("the job ran on %d nodes %v, the partition has %d stages", len(r.Nodes), r.Nodes, j.stages)
				}
				if r.Steps != 6 || !r.Deterministic {
					t.Errorf("result: %d steps, deterministic %v; want 6 steps, deterministic", r.Steps, r.Deterministic)
				}
			})
		}
	}
}

// waitMembers waits until n sees want alive members.
func waitMembers(t *testing.T, n *Node, want int) {
	t.Helper()
	var last []string
	err := Poll(fmt.Sprintf("node %s sees %d members", n.Name, want), 10*time.Second, 20*time.Millisecond, func() (bool, error) {
		st, err := n.Status()
		if err != nil {
			return false, err
		}
		last = Alive(st)
		return len(last) == want, nil
	})
	if err != nil {
		t.Fatalf("%v (last: %v)", err, last)
	}
}

// A node that joins while a job trains does not change the job's result.
func TestJoinDuringJob(t *testing.T) {
	t.Parallel()
	c := StartCluster(t, NodeOptions{Threads: 1}, NodeOptions{Threads: 1})
	waitMembers(t, c.Node("a"), 2)
	spec := job.DefaultSpec()
	spec.ID = "join-during"
	spec.Model, spec.Width, spec.Data, spec.SyntheticSamples = "mlp32", 64, "synthetic:8x8x1:4", 1024
	// 60 to 310 steps a second here, loaded or idle: 3 s or more, long
	// enough for a node to join (one to two seconds) while it trains.
	spec.Batch, spec.MicroBatches, spec.Epochs, spec.Steps = 32, 4, 40, 1000
	spec.Deterministic, spec.Threads = true, 1
	spec.Partition, spec.Schedule = "fc1-fc16@a; fc17-fc32@b", "1f1b"
	rep, err := c.Node("a").Submit(spec)
	if err != nil {
		t.Fatal(err)
	}
	if st, err := c.Node("a").WaitJob(rep.ID, time.Minute, func(s job.Status) bool { return s.Step >= 1 }); err != nil {
		t.Fatal(err)
	} else if st.State == job.StateFailed {
		t.Fatalf("the job failed at step %d/%d: %s", st.Step, st.Total, st.Error)
	}
	joined := c.Join(NodeOptions{Name: "c", Threads: 1})
	st, err := c.Node("a").Job(rep.ID)
	if err != nil {
		t.Fatal(err)
	}
	if st.State == job.StateFailed {
		t.Fatalf("the job failed at step %d/%d: %s", st.Step, st.Total, st.Error)
	}
	if st.State != job.StateTraining {
		t.Fatalf("the job was no longer training (%s at step %d/%d) before node c was ready: make it longer", st.State, st.Step, st.Total)
	}
	t.Logf("node c ready at step %d/%d (%s)", st.Step, st.Total, st.State)
	waitMembers(t, c.Node("a"), 3)
	st, err = c.Node("a").WaitJob(rep.ID, 2*time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}
	if st.State != job.StateDone || st.Result == nil {
		t.Fatalf("job %s: %s %s", rep.ID, st.State, st.Error)
	}
	if want := localSHA(t, spec); st.Result.WeightsSHA256 != want {
		t.Errorf("weights %s with a node joining, %s in one process", st.Result.WeightsSHA256, want)
	}
	if slices.Contains(st.Result.Nodes, joined.Name) {
		t.Errorf("the job used the node that joined during it: %v", st.Result.Nodes)
	}
}

// A node that leaves while idle is gone from the others' membership
// within 2 s, and exits cleanly.
func TestLeaveWhileIdle(t *testing.T) {
	t.Parallel()
	c := StartCluster(t, NodeOptions{}, NodeOptions{}, NodeOptions{})
	waitMembers(t, c.Node("a"), 3)
	start := time.Now()
	leaving := c.Node("c")
	stopped := make(chan error, 1)
	go func() { stopped <- c.Stop(leaving) }()
	var last []string
	err := Poll("node c gone from a's members", 2*time.Second, 10*time.Millisecond, func() (bool, error) {
		st, err := c.Node("a").Status()
		if err != nil {
			return false, err
		}
		last = Alive(st)
		return !slices.Contains(last, "c"), nil
	})
	if err != nil {
		t.Fatalf("%v (members still %v)", err, last)
	}
	t.Logf("node c gone from a's members %v after SIGTERM", time.Since(start).Round(time.Millisecond))
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
	if st, err := c.Node("b").Status(); err != nil || slices.Contains(Alive(st), "c") {
		t.Errorf("node b: members %v (%v)", Alive(st), err)
	}
}

// A bad job spec is refused with a clear message and nothing starts.
func TestBadSpecRefused(t *testing.T) {
	t.Parallel()
	c := StartCluster(t, NodeOptions{Threads: 1}, NodeOptions{Threads: 1})
	waitMembers(t, c.Node("a"), 2)
	base := job.DefaultSpec()
	base.Data, base.SyntheticSamples, base.Width = "synthetic:8x8x1:4", 256, 32
	base.Batch, base.Steps, base.Threads = 32, 2, 1
	cases := []struct {
		name  string
		edit  func(*job.Spec)
		words []string // the message names the problem
	}{
		{"unknown model", func(s *job.Spec) { s.Model = "gpt5" }, []string{"gpt5"}},
		{"missing layer", func(s *job.Spec) { s.Partition = "fc1-fc15@a; fc17-fc32@b" }, []string{"fc16"}},
		{"more stages than nodes", func(s *job.Spec) { s.Partition = "fc1-fc10; fc11-fc20; fc21-fc32" }, []string{"node"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			spec := base
			spec.ID = strings.ReplaceAll(tc.name, " ", "-")
			tc.edit(&spec)
			rep, err := c.Node("a").Submit(spec)
			var ae *nodes.APIError
			if !errors.As(err, &ae) || ae.Code != 400 || !errors.Is(err, job.ErrSpec) {
				t.Fatalf("POST /v1/jobs answered %+v, %v; want 400, a bad spec", rep, err)
			}
			t.Logf("%v", err)
			for _, w := range tc.words {
				if !strings.Contains(ae.Msg, w) {
					t.Errorf("the error %q does not mention %q", ae.Msg, w)
				}
			}
			for _, n := range c.Nodes() {
				st, err := n.Status()
				if err != nil {
					t.Fatal(err)
				}
				if len(st.Jobs) > 0 {
					t.Errorf("node %s has jobs after a refused spec: %+v", n.Name, st.Jobs)
				}
			}
			if _, err := c.Node("a").Job(spec.ID); err == nil {
				t.Errorf("GET /v1/jobs/%s answers for a refused job", spec.ID)
			}
		})
	}
}

// On nodes of unequal speed (cgroup CPU quotas) the automatic plan still
// gives the weights of one process.
func TestExactnessUnequalCPUs(t *testing.T) {
	RequireCPUQuota(t)
	t.Parallel()
	c := StartCluster(t,
		NodeOptions{CPUQuota: 1, Threads: 1},
		NodeOptions{CPUQuota: 0.5, Threads: 1},
		NodeOptions{CPUQuota: 0.25, Threads: 1})
	waitMembers(t, c.Node("a"), 3)
	want, err := Train(t, 0, append([]string{"--local"}, small...)...)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range [][2]string{{"auto", "auto"}, {"uniform", "1f1b"}} {
		r, err := Train(t, 30*time.Second, append([]string{"--via", c.Node("c").HTTP, "--partition", p[0], "--schedule", p[1]}, small...)...)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("plan %q, schedule %s, nodes %v", r.Plan, r.Schedule, r.Nodes)
		if r.WeightsSHA256 != want.WeightsSHA256 {
			t.Errorf("%s/%s: weights %s through the cluster, %s in one process", p[0], p[1], r.WeightsSHA256, want.WeightsSHA256)
		}
	}
}

// `ppnode demo` starts its nodes, trains across them and stops them,
// leaving no process and no cgroup behind (a short job on synthetic data;
// `make demo` runs the real one).
func TestDemo(t *testing.T) {
	t.Parallel()
	NewCluster(t) // for its leak checks
	out, err := Run(t, time.Minute, "demo", "--nodes", "2", "--data", "synthetic:8x8x1:4", "--steps", "20", "--min-accuracy", "0")
	if err != nil {
		t.Fatal(err)
	}
	t.Log(strings.TrimSpace(out))
	if !strings.Contains(out, "test accuracy") {
		t.Errorf("no result line in the demo's output")
	}
	left, _ := filepath.Glob(filepath.Join(CgroupCPU, "ppnode-demo-*"))
	if len(left) > 0 {
		t.Errorf("leak: cgroups left after the demo: %v", left)
	}
}
