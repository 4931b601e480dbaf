package balance

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/ppnode/ppnode/nn/zoo"
)

// The executors of a replicated mlp32: IDs, micro-batches (blocks with
// chained sums, interleaved otherwise), the executor each micro-batch is
// exchanged with, and the gradient-sum chain in both orders; the plan
// survives JSON.
func TestReplicatedPlanStructure(t *testing.T) {
	g := build(t, "mlp32", zoo.Options{Width: 8, Input: []int{4, 4, 1}})
	nodes := []string{"a", "b", "c", "d", "e"}
	part, err := ParseSpec(g, "fc1-fc16@a,b; fc17-fc32@c:1,d:2,e:2", nodes)
	if err != nil {
		t.Fatal(err)
	}
	for _, chained := range []bool{false, true} {
		p, err := buildPlan(g, part, nodes, OneFOneB, 5, 2, chained)
		if err != nil {
			t.Fatal(err)
		}
		type ex struct {
			group, replica int
			node           string
			micros         string
		}
		// Blocks with chained sums, else interleaved by shares.
		want := []ex{{0, 0, "a", "[0 1 2]"}, {0, 1, "b", "[3 4]"}, {1, 0, "c", "[0]"}, {1, 1, "d", "[1 2]"}, {1, 2, "e", "[3 4]"}}
		exec0, exec1 := []int{0, 0, 0, 1, 1}, []int{2, 3, 3, 4, 4}
		if !chained {
			want = []ex{{0, 0, "a", "[0 2 3]"}, {0, 1, "b", "[1 4]"}, {1, 0, "c", "[2]"}, {1, 1, "d", "[0 3]"}, {1, 2, "e", "[1 4]"}}
			exec0, exec1 = []int{0, 1, 0, 0, 1}, []int{3, 4, 2, 3, 4}
		}
		for i, st := range p.Stages {
			if got := (ex{st.Group, st.Replica, st.Node, fmt.Sprint(st.Micros())}); st.ID != i || got != want[i] {
				t.Fatalf("chained=%v: executor %d is %+v, want %+v", chained, i, got, want[i])
			}
			if !slices.Equal(st.Layers, p.Stages[i-st.Replica].Layers) {
				t.Fatalf("executor %d runs other layers than replica 0", i)
			}
		}
		// Micro-batch m goes from the executor of stage 0 that runs it to
		// the executor of stage 1 that runs it, and its gradient back.
		for i, st := range p.Stages {
			for _, in := range st.Program {
				var peer int
				switch {
				case in.Op == OpSendAct || in.Op == OpRecvGrad:
					peer = exec1[in.Micro]
				case (in.Op == OpRecvAct || in.Op == OpSendGrad) && st.Group == 1:
					peer = exec0[in.Micro]
				default:
					continue
				}
				if in.Peer != peer {
					t.Fatalf("executor %d: %v, want peer %d", i, in, peer)
				}
			}
		}
		// The sums: replica r after r-1, the last sends the total to all.
		sums := map[int]string{
			0: "send_sum peer=1, recv_sum peer=1",
			1: "recv_sum peer=0, send_sum peer=0",
			2: "send_sum peer=3, recv_sum peer=4",
			3: "recv_sum peer=2, send_sum peer=4, recv_sum peer=4",
			4: "recv_sum peer=3, send_sum peer=2, send_sum peer=3",
		}
		for i, st := range p.Stages {
			var got []string
			firstB := slices.IndexFunc(st.Program, func(in Instr) bool { return in.Op == OpBackward })
			for k, in := range st.Program {
				if in.Op.sum() {
					got = append(got, in.String())
					if early := k < firstB; early != (chained && st.Replica > 0 && len(got) == 1) {
						t.Fatalf("chained=%v: executor %d has %v at %d, first backward at %d", chained, i, in, k, firstB)
					}
				}
			}
			if strings.Join(got, ", ") != sums[i] {
				t.Fatalf("executor %d sums %v, want %s", i, got, sums[i])
			}
		}
		if err := p.Validate(g); err != nil {
			t.Fatal(err)
		}
		b, err := json.Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		var back Plan
		if err := json.Unmarshal(b, &back); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(&back, p) || back.Hash() != p.Hash() || back.ChainedSums != chained {
			t.Fatalf("the replicated plan changed through JSON")
		}
		if got := FormatSpec(g, p.Partition()); got != "fc1-fc16@a,b; fc17-fc32@c:1,d:2,e:2" {
			t.Fatalf("plan's partition is %q", got)
		}
	}
}

// A plan without replicas writes none of the replicas' fields: its JSON,
// and so its hash, is what it was before replicas existed.
func TestUnreplicatedPlanJSON(t *testing.T) {
	g := build(t, "uno", zoo.Options{Width: 0.02, Input: []int{6, 6, 1}})
	nodes := []string{"a", "b", "c", "d"}
	part, err := ParseSpec(g, "flatten + tower1.slice-tower1.fc3@a; tower2.slice-tower2.fc3@b; tower3.slice-tower3.fc3@c; concat-out@d", nodes)
	if err != nil {
		t.Fatal(err)
	}
	p, err := buildPlan(g, part, nodes, GraphSchedule, 4, 2, true)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(p)
	for _, key := range []string{`"group"`, `"replica"`, `"chained_sums"`, `recv_sum`, `send_sum`} {
		if strings.Contains(string(b), key) {
			t.Fatalf("a plan without replicas writes %s", key)
		}
	}
	var back Plan
	if err := json.Unmarshal(b, &back); err != nil || !reflect.DeepEqual(&back, p) {
		t.Fatalf("plan changed through JSON (%v)", err)
	}
	for _, st := range back.Stages {
		if st.Group != st.ID {
			t.Fatalf("stage %d reads back as group %d", st.ID, st.Group)
		}
	}
}

// Shares that do not add up to M, and more nodes than micro-batches, are
// refused at Build, naming the stage.
func TestReplicatedBuildErrors(t *testing.T) {
	g := build(t, "mlp32", zoo.Options{Width: 8, Input: []int{4, 4, 1}})
	nodes := []string{"a", "b", "c", "d"}
	for _, c := range []struct {
		spec string
		M    int
		msg  string
	}{
		{"fc1-fc16@a:3,b:2; fc17-fc32@c", 4, "stage 0 shares [3 2] micro-batches among its nodes; the plan has 4"},
		{"fc1-fc16@a; fc17-fc32@b,c,d", 2, "stage 1 has 3 nodes for 2 micro-batches"},
	} {
		part, err := ParseSpec(g, c.spec, nodes)
		if err != nil {
			t.Fatal(err)
		}
		_, err = Build(g, part, nodes, GPipe, c.M, 1)
		if !errors.Is(err, ErrPlan) || !strings.Contains(err.Error(), c.msg) {
			t.Fatalf("%q at M=%d: %v, want ErrPlan mentioning %q", c.spec, c.M, err, c.msg)
		}
	}
	var all []string
	for _, n := range g.Nodes {
		all = append(all, n.Name)
	}
	for _, st := range []PartStage{
		{Node: "a", Layers: all, Replicas: []string{"b"}, Shares: []int{4}},
		{Node: "a", Layers: all, Shares: []int{4}},
		{Node: "a", Layers: all, Replicas: []string{"b"}, Shares: []int{4, 0}},
	} {
		err := (&Partition{Stages: []PartStage{st}}).Validate(g, nodes)
		if !errors.Is(err, ErrPlan) || !strings.Contains(err.Error(), "stage 0") {
			t.Fatalf("%+v: %v, want ErrPlan naming stage 0", st, err)
		}
	}
}

// Validate rejects replicated plans the runtime must not run.
func TestReplicatedPlanValidateRejects(t *testing.T) {
	g := build(t, "mlp32", zoo.Options{Width: 8, Input: []int{4, 4, 1}})
	nodes := []string{"a", "b", "c", "d"}
	part, err := ParseSpec(g, "fc1-fc10@a,b; fc11-fc20@c; fc21-fc32@d", nodes)
	if err != nil {
		t.Fatal(err)
	}
	good, err := buildPlan(g, part, nodes, OneFOneB, 4, 2, true)
	if err != nil {
		t.Fatal(err)
	}
	if err := good.Validate(g); err != nil {
		t.Fatal(err)
	}
	find := func(p *Plan, s int, op Op, m int) int { return findInstr(t, p, s, op, m) }
	for _, c := range []struct {
		name   string
		change func(p *Plan)
		msg    string
	}{
		{"replicas swapped", func(p *Plan) { p.Stages[0].Replica, p.Stages[1].Replica = 1, 0 }, "replicas of a stage are adjacent"},
		{"group skipped", func(p *Plan) { p.Stages[2].Group = 2 }, "replica 0 of stage 2"},
		{"replica's layers differ", func(p *Plan) { p.Stages[1].Layers = p.Stages[1].Layers[:len(p.Stages[1].Layers)-2] }, "differs from replica 0"},
		{"peer does not run the micro-batch", func(p *Plan) { p.Stages[2].Program[find(p, 2, OpRecvAct, 0)].Peer = 1 }, "stage 1 does not run micro-batch 0"},
		{"forward of the other replica's block", func(p *Plan) { p.Stages[1].Program[find(p, 1, OpForward, 2)].Micro = 1 }, "outside its micro-batches"},
		{"sum missing", func(p *Plan) {
			k := find(p, 0, OpSendSum, 0)
			p.Stages[0].Program = slices.Delete(p.Stages[0].Program, k, k+1)
		}, "sums its gradients"},
		{"chained sum after a backward", func(p *Plan) {
			prog := p.Stages[1].Program
			k := find(p, 1, OpRecvSum, 0)
			b := find(p, 1, OpBackward, 2)
			prog[k], prog[b] = prog[b], prog[k]
		}, "sums its gradients"},
		{"order flipped", func(p *Plan) { p.ChainedSums = false }, "outside its micro-batches"},
		{"sum names tensors", func(p *Plan) { p.Stages[0].Program[find(p, 0, OpSendSum, 0)].Tensors = []string{"fc1"} }, "names tensors"},
		{"sum to another stage", func(p *Plan) {
			p.Stages[0].Program[find(p, 0, OpSendSum, 0)].Peer = 2
		}, "sums its gradients"},
	} {
		t.Run(c.name, func(t *testing.T) {
			b, _ := json.Marshal(good)
			var p Plan
			if err := json.Unmarshal(b, &p); err != nil {
				t.Fatal(err)
			}
			c.change(&p)
			err := p.Validate(g)
			if err == nil || !strings.Contains(err.Error(), c.msg) {
				t.Fatalf("Validate = %v, want an error mentioning %q", err, c.msg)
			}
		})
	}
}

// Random stage DAGs of uno, resnet50 and mlp32 with random replica
// counts, shares, schedules and sum orders: every executor's program
// passes Validate (no deadlock, every transfer with the executor that
// runs its micro-batch, a well-formed sum chain) and the plan simulates.
func TestRandomReplicatedPlansValidate(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 9))
	models := []string{"uno", "resnet50", "mlp32"}
	opts := []zoo.Options{{Width: 0.02, Input: []int{6, 6, 1}}, {Width: 1.0 / 16, Input: []int{8, 8, 3}}, {Width: 8, Input: []int{4, 4, 1}}}
	ok, replicated := 0, 0
	for k, m := range models {
		g := build(t, m, opts[k])
		prof := Analytic(g, AnalyticOptions{})
		l := newLayout(g, prof)
		for trial := 0; trial < 150; trial++ {
			S := 1 + r.IntN(4)
			M := 1 + r.IntN(7)
			var nodes []string
			cl := &Cluster{}
			part := &Partition{}
			for s := 0; s < S; s++ {
				st := PartStage{}
				R := 1 + r.IntN(min(M, 3))
				for k := 0; k < R; k++ {
					name := fmt.Sprintf("n%d", len(nodes))
					nodes = append(nodes, name)
					cl.Nodes = append(cl.Nodes, NodeProfile{Name: name, Speed: 0.5 + r.Float64()})
					if k == 0 {
						st.Node = name
					} else {
						st.Replicas = append(st.Replicas, name)
					}
				}
				if R > 1 && r.IntN(2) == 0 {
					// A random composition of M into R positive shares.
					cuts := r.Perm(M - 1)[:R-1]
					slices.Sort(cuts)
					prev := 0
					for _, c := range append(cuts, M-1) {
						st.Shares = append(st.Shares, c+1-prev)
						prev = c + 1
					}
				}
				part.Stages = append(part.Stages, st)
			}
			U := len(l.units)
			for u := 0; u < U; {
				e := min(U, u+1+r.IntN(max(1, U/S)))
				s := r.IntN(S)
				part.Stages[s].Layers = append(part.Stages[s].Layers, l.unitNames(u, e)...)
				u = e
			}
			for _, sched := range []Schedule{GPipe, OneFOneB, GraphSchedule} {
				chained := r.IntN(2) == 0
				p, err := buildPlan(g, part, nodes, sched, M, 1, chained)
				if err != nil {
					if errors.Is(err, ErrCycle) || errors.Is(err, ErrEmptyStage) || errors.Is(err, ErrPlan) || errors.Is(err, ErrGradientOrder) {
						continue
					}
					t.Fatal(err)
				}
				if err := p.Validate(g); err != nil {
					t.Fatalf("%s trial %d %s M=%d chained=%v %s: %v", m, trial, sched, M, chained, FormatSpec(g, part), err)
				}
				if _, err := Simulate(p, g, prof, cl, SimOptions{}); err != nil {
					t.Fatalf("%s trial %d: %v", m, trial, err)
				}
				ok++
				if p.Replicated() {
					replicated++
				}
			}
		}
	}
	t.Logf("%d valid plans, %d with replicas", ok, replicated)
	if replicated < 200 {
		t.Fatalf("only %d random replicated plans were valid", replicated)
	}
}

// A partition with replicated stages drives the search: with explicit
// shares only the micro-batch count they add up to is tried, with equal
// shares only counts that give every node one; counts that fit none are
// refused naming the stage.
func TestSearchWithReplicatedPartition(t *testing.T) {
	g := build(t, "mlp32", zoo.Options{Width: 16})
	prof := Analytic(g, AnalyticOptions{})
	c := equalNodes(4)
	for _, tc := range []struct {
		spec  string
		micro int
		M     int    // want, or 0 for an error
		msg   string // of the error
	}{
		{"fc1-fc16@a:3,b:1; fc17-fc32@c", 0, 4, ""},
		{"fc1-fc16@a,b,c; fc17-fc32@d", 2, 0, "stage 0 has 3 nodes for 2 micro-batches"},
		{"fc1-fc16@a:3,b:1; fc17-fc32@c", 8, 0, "stage 0 shares [3 1] micro-batches among its nodes; the plan has 8"},
		{"fc1-fc16@a:30,b:1; fc17-fc32@c", 0, 0, "fit none of the micro-batch counts"},
	} {
		res, err := Search(g, prof, c, Options{Partitioner: tc.spec, Batch: 32, MicroBatches: tc.micro})
		if tc.M == 0 {
			if !errors.Is(err, ErrPlan) || !strings.Contains(err.Error(), tc.msg) {
				t.Errorf("%q M=%d: %v, want ErrPlan mentioning %q", tc.spec, tc.micro, err, tc.msg)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%q: %v", tc.spec, err)
		}
		if res.Plan.MicroBatches != tc.M || res.Spec != tc.spec || res.Plan.Partitioner != "spec" {
			t.Errorf("%q: plan M=%d %q, want M=%d and the same description", tc.spec, res.Plan.MicroBatches, res.Spec, tc.M)
		}
	}
}
