package balance

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/ppnode/ppnode/nn"
	"github.com/ppnode/ppnode/nn/zoo"
)

// tie makes layer b's weight a copy of layer a's (tied weights).
func tie(t *testing.T, g *nn.Graph, a, b string) {
	t.Helper()
	pa, pb := g.Node(a).Layer.Params()[0], g.Node(b).Layer.Params()[0]
	if !nn.SameShape(pa.Value.Shape(), pb.Value.Shape()) {
		t.Fatalf("%s and %s differ in shape", a, b)
	}
	pb.Name = pa.Name
}

func tieInstrs(prog []Instr) []string {
	var out []string
	for _, in := range prog {
		if in.Op.tie() {
			out = append(out, in.String())
		}
	}
	return out
}

// Copies of a tied weight on different stages exchange their gradients
// before the step: replica 0 of a stage sends to every executor of the
// other stage, every executor receives from replica 0; copies on one
// stage exchange nothing. The plan validates, survives JSON, and a plan
// whose exchange is missing or moved is refused.
func TestTiedPlan(t *testing.T) {
	g := build(t, "mlp32", zoo.Options{Width: 8, Input: []int{4, 4, 1}})
	tie(t, g, "fc2", "fc30")
	tie(t, g, "fc3", "fc4")
	nodes := []string{"a", "b", "c", "d"}
	part, err := ParseSpec(g, "fc1-fc10@a,b; fc11-fc20@c; fc21-fc32@d", nodes)
	if err != nil {
		t.Fatal(err)
	}
	p, err := buildPlan(g, part, nodes, OneFOneB, 4, 2, true)
	if err != nil {
		t.Fatal(err)
	}
	want := [][]string{
		{"send_tie peer=3 [fc2]", "recv_tie peer=3 [fc30]"},
		{"recv_tie peer=3 [fc30]"},
		nil,
		{"send_tie peer=0 [fc30]", "send_tie peer=1 [fc30]", "recv_tie peer=0 [fc2]"},
	}
	for e, st := range p.Stages {
		if got := tieInstrs(st.Program); !slices.Equal(got, want[e]) {
			t.Errorf("executor %d exchanges %q, want %q", e, got, want[e])
		}
		n := len(st.Program)
		if len(want[e]) > 0 && !st.Program[n-2].Op.tie() {
			t.Errorf("executor %d: the exchange is not just before the step", e)
		}
	}
	if err := p.Validate(g); err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(p)
	var back Plan
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if err := back.Validate(g); err != nil {
		t.Fatalf("after JSON: %v", err)
	}
	for _, c := range []struct {
		name   string
		change func(p *Plan)
	}{
		{"send missing", func(p *Plan) {
			prog := p.Stages[3].Program
			p.Stages[3].Program = slices.Delete(prog, len(prog)-3, len(prog)-2)
		}},
		{"sent before the backward passes", func(p *Plan) {
			prog := p.Stages[0].Program
			k := len(prog) - 3
			in := prog[k]
			prog = slices.Delete(prog, k, k+1)
			p.Stages[0].Program = slices.Insert(prog, 0, in)
		}},
		{"other layers", func(p *Plan) { p.Stages[0].Program[len(p.Stages[0].Program)-3].Tensors = []string{"fc3"} }},
	} {
		t.Run(c.name, func(t *testing.T) {
			var q Plan
			if err := json.Unmarshal(b, &q); err != nil {
				t.Fatal(err)
			}
			c.change(&q)
			if err := q.Validate(g); err == nil || !strings.Contains(err.Error(), "tied gradients") {
				t.Fatalf("Validate = %v, want a refusal of the tied gradients' exchange", err)
			}
		})
	}
}

// Under the interleaved schedule a node's chunks may hold copies of one
// tensor: every chunk's sends come before any chunk's receives, so the
// node does not wait for itself.
func TestTiedInterleaved(t *testing.T) {
	g := build(t, "mlp32", zoo.Options{Width: 8, Input: []int{4, 4, 1}})
	tie(t, g, "fc2", "fc20") // chunks 0 and 2, both on node a
	tie(t, g, "fc3", "fc30") // chunks 0 and 3
	nodes := []string{"a", "b"}
	part, err := ParseSpec(g, "fc1-fc8@a; fc9-fc16@b; fc17-fc24@a; fc25-fc32@b", nodes)
	if err != nil {
		t.Fatal(err)
	}
	p, err := Build(g, part, nodes, Interleaved, 4, 2)
	if err != nil {
		t.Fatal(err)
	}
	if got := tieInstrs(p.Stages[0].Program); !slices.Equal(got, []string{
		"send_tie peer=2 [fc2]", "send_tie peer=3 [fc3]", "recv_tie peer=2 [fc20]", "recv_tie peer=3 [fc30]"}) {
		t.Fatalf("chunk 0 exchanges %q", got)
	}
	if err := p.Validate(g); err != nil {
		t.Fatal(err)
	}
}
