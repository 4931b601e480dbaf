package balance

import (
	"encoding/json"
	"errors"
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/ppnode/ppnode/nn/zoo"
)

// A plan survives JSON, hashes the same after it, and validates; a
// different plan hashes differently.
func TestPlanJSONAndHash(t *testing.T) {
	g := build(t, "uno", zoo.Options{Width: 0.1})
	res, err := Search(g, Analytic(g, AnalyticOptions{}), equalNodes(4), Options{Partitioner: GraphPP, Batch: 16, MicroBatches: 4})
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(res.Plan)
	if err != nil {
		t.Fatal(err)
	}
	var back Plan
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(&back, res.Plan) || back.Hash() != res.Plan.Hash() {
		t.Fatalf("plan changed through JSON")
	}
	if err := back.Validate(g); err != nil {
		t.Fatal(err)
	}
	again, _ := Build(g, back.Partition(), []string{"a", "b", "c", "d"}, back.Schedule, 4, back.MicroBatchSize)
	again.Partitioner = back.Partitioner
	if again.Hash() != back.Hash() {
		t.Fatalf("rebuilding the plan changes its hash")
	}
	other, _ := Build(g, back.Partition(), []string{"a", "b", "c", "d"}, back.Schedule, 2, back.MicroBatchSize)
	if other.Hash() == back.Hash() {
		t.Fatalf("plans with different M hash the same")
	}
}

// Validate rejects plans the runtime must not run.
func TestPlanValidateRejects(t *testing.T) {
	g := build(t, "mlp32", zoo.Options{Width: 8, Input: []int{4, 4, 1}})
	part, err := ParseSpec(g, "fc1-fc10@a; fc11-fc20@b; fc21-fc32@c", []string{"a", "b", "c"})
	if err != nil {
		t.Fatal(err)
	}
	good, err := Build(g, part, []string{"a", "b", "c"}, OneFOneB, 4, 2)
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
	}{
		{"backward out of order", func(p *Plan) {
			a, b := find(p, 1, OpBackward, 0), find(p, 1, OpBackward, 1)
			p.Stages[1].Program[a].Micro, p.Stages[1].Program[b].Micro = 1, 0
		}},
		{"step missing", func(p *Plan) { p.Stages[0].Program = p.Stages[0].Program[:len(p.Stages[0].Program)-1] }},
		{"wrong tensor", func(p *Plan) { p.Stages[1].Program[find(p, 1, OpSendAct, 2)].Tensors = []string{"fc3"} }},
		{"receive never sent", func(p *Plan) { p.Stages[2].Program[find(p, 2, OpRecvAct, 3)].Micro = 0 }},
		{"layer moved", func(p *Plan) { p.Stages[0].Layers = p.Stages[0].Layers[:len(p.Stages[0].Layers)-2] }},
		{"other model", func(p *Plan) { p.Graph = "0000" }},
	} {
		t.Run(c.name, func(t *testing.T) {
			b, _ := json.Marshal(good)
			var p Plan
			json.Unmarshal(b, &p)
			c.change(&p)
			if err := p.Validate(g); err == nil {
				t.Fatal("Validate accepted the plan")
			}
		})
	}
}

// Random partitions of multi-branch models into stage DAGs, every
// schedule and micro-batch count (including fewer micro-batches than
// stages): the programs never deadlock and every plan validates.
func TestRandomStageDAGsDoNotDeadlock(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 7))
	models := []string{"uno", "resnet50"}
	opts := []zoo.Options{{Width: 0.02, Input: []int{6, 6, 1}}, {Width: 1.0 / 16, Input: []int{8, 8, 3}}}
	ok := 0
	for k, m := range models {
		g := build(t, m, opts[k])
		l := newLayout(g, Analytic(g, AnalyticOptions{}))
		for trial := 0; trial < 250; trial++ {
			S := 2 + r.IntN(5)
			var nodes []string
			part := &Partition{}
			for s := 0; s < S; s++ {
				nodes = append(nodes, string(rune('a'+s)))
				part.Stages = append(part.Stages, PartStage{Node: nodes[s]})
			}
			// Contiguous runs of units with random stage labels make
			// DAGs, cycles and skips.
			U := len(l.units)
			for u := 0; u < U; {
				e := min(U, u+1+r.IntN(max(1, U/S)))
				s := r.IntN(S)
				part.Stages[s].Layers = append(part.Stages[s].Layers, l.unitNames(u, e)...)
				u = e
			}
			for _, sched := range []Schedule{GPipe, OneFOneB, GraphSchedule} {
				M := 1 + r.IntN(6)
				p, err := Build(g, part, nodes, sched, M, 1)
				if err != nil {
					if errors.Is(err, ErrCycle) || errors.Is(err, ErrEmptyStage) || errors.Is(err, ErrPlan) || errors.Is(err, ErrGradientOrder) {
						continue
					}
					t.Fatal(err)
				}
				if err := p.Validate(g); err != nil {
					t.Fatalf("%s trial %d %s M=%d: %v", m, trial, sched, M, err)
				}
				ok++
			}
		}
	}
	if ok < 100 {
		t.Fatalf("only %d random plans were valid", ok)
	}
}

// findInstr returns the index in stage s's program of the instruction op
// for micro-batch m (a sum instruction: the stage's first, whatever m).
func findInstr(t *testing.T, p *Plan, s int, op Op, m int) int {
	t.Helper()
	for k, in := range p.Stages[s].Program {
		if in.Op == op && (in.Micro == m || op.sum()) {
			return k
		}
	}
	t.Fatalf("no %s %d on stage %d", op, m, s)
	return -1
}
