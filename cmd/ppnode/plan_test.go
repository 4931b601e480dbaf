package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ppnode/ppnode/balance"
	"github.com/ppnode/ppnode/nn/zoo"
)

// `ppnode plan --replicas` plans uno over 16 equal nodes with replicated
// stages and prints one row per replica, the JSON summary with their
// groups and micro-batches, a Gantt chart with the gradient sums, and a
// plan that validates.
func TestPlanReplicas(t *testing.T) {
	dir := t.TempDir()
	nodes := make([]string, 16)
	for i := range nodes {
		nodes[i] = string(rune('a'+i)) + "=1"
	}
	svg, out := filepath.Join(dir, "plan.svg"), filepath.Join(dir, "plan.json")
	text, pr := planJSON(t, "--model", "uno", "--width", "1", "--nodes", strings.Join(nodes, ","), "--link", "10Gbit", "--profile", "analytic",
		"--batch", "256", "--partition", "graph", "--replicas", "--json", "--svg", svg, "--out", out)
	replicas := 0
	for _, st := range pr.Stages {
		if st.Group == nil || len(st.MicroBatches) == 0 {
			t.Fatalf("stage %d has no group or micro-batches in\n%s", st.ID, text)
		}
		if st.Replica > 0 {
			replicas++
		}
	}
	if replicas == 0 || !strings.Contains(text, "s0.1 ") || !strings.Contains(text, "replicated stages:") || !strings.Contains(pr.Spec, ",") {
		t.Fatalf("no replicated stage in\n%s", text)
	}
	b, err := os.ReadFile(svg)
	if err != nil || !bytes.Contains(b, []byte("gradient sum")) {
		t.Fatalf("the chart has no gradient sums (%v)", err)
	}
	b, err = os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var p balance.Plan
	if err := json.Unmarshal(b, &p); err != nil {
		t.Fatal(err)
	}
	g, err := zoo.Build("uno", zoo.Options{Width: 1, Input: []int{28, 28, 1}, Classes: 10})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Validate(g); err != nil || !p.Replicated() || p.Hash() != pr.PlanHash {
		t.Fatalf("the written plan: %v (replicated %v)", err, p.Replicated())
	}
}

// A hand-written partition with replicas and shares is planned as given,
// the micro-batches interleaved by share; --deterministic gives the
// replicas blocks of consecutive micro-batches and the chained sums.
func TestPlanReplicatedPartition(t *testing.T) {
	for _, det := range []bool{false, true} {
		args := []string{"plan", "--model", "mlp32", "--width", "64", "--nodes", "a=1,b=1,c=1,d=0.5", "--profile", "analytic",
			"--partition", "fc1-fc16@a,b; fc17-fc32@c:5,d:3", "--micro-batches", "8"}
		want := []string{"s1.1    d", "(micro-batches 1,4,7)", "fast order"} // interleaved by share
		if det {
			args = append(args, "--deterministic")
			want = []string{"s1.1    d", "(micro-batches 5-7)", "chained, as one process adds them"}
		}
		var stdout, stderr bytes.Buffer
		if code := run(args, &stdout, &stderr); code != 0 {
			t.Fatalf("exit %d: %s", code, stderr.String())
		}
		for _, w := range want {
			if !strings.Contains(stdout.String(), w) {
				t.Errorf("deterministic=%v: output lacks %q:\n%s", det, w, stdout.String())
			}
		}
	}
}

// `ppnode plan --schedule interleaved --chunks 2` plans mlp32 on 4 nodes
// as 8 stages, stage s on node s mod 4, names the schedule with its
// chunks, and draws one row per node; 6 micro-batches on 4 nodes are
// refused with the reason.
func TestPlanInterleaved(t *testing.T) {
	svg := filepath.Join(t.TempDir(), "plan.svg")
	text, pr := planJSON(t, "--model", "mlp32", "--width", "64", "--nodes", "a=1,b=1,c=1,d=1", "--profile", "analytic",
		"--batch", "64", "--micro-batches", "8", "--schedule", "interleaved", "--chunks", "2", "--json", "--svg", svg)
	if !strings.Contains(text, "interleaved (2 chunks per node) schedule") || pr.Chunks != 2 || len(pr.Stages) != 8 {
		t.Fatalf("%d stages, %d chunks in\n%s", len(pr.Stages), pr.Chunks, text)
	}
	for s, st := range pr.Stages {
		if st.Node != pr.Stages[s%4].Node {
			t.Errorf("stage %d on %s, stage %d on %s", s, st.Node, s%4, pr.Stages[s%4].Node)
		}
	}
	b, err := os.ReadFile(svg)
	if err != nil || !bytes.Contains(b, []byte("8 stages on 4 nodes, 2 chunks each")) || !bytes.Contains(b, []byte(">a: s0,s4")) {
		t.Fatalf("the chart does not draw a row per node (%v)", err)
	}
	var stdout, stderr bytes.Buffer
	args := []string{"plan", "--model", "mlp32", "--width", "64", "--nodes", "a=1,b=1,c=1,d=1", "--profile", "analytic",
		"--batch", "48", "--micro-batches", "6", "--schedule", "interleaved"}
	if code := run(args, &stdout, &stderr); code == 0 || !strings.Contains(stderr.String(), "6 micro-batches on 4 nodes") {
		t.Fatalf("M=6 on 4 nodes: exit %d: %s", code, stderr.String())
	}
}

// `ppnode plan --freeze` plans a fine-tuning: frozen layers before the
// first trainable one cost no backward pass, frozen ones after it their
// input gradients only, so the step is shorter; a prefix that names no
// parameter is refused.
func TestPlanFreeze(t *testing.T) {
	args := []string{"--model", "mlp32", "--width", "64", "--nodes", "a=1,b=1", "--profile", "analytic",
		"--batch", "64", "--micro-batches", "4", "--partition", "uniform", "--schedule", "1f1b", "--json"}
	var middle []string
	for i := 9; i <= 24; i++ {
		middle = append(middle, fmt.Sprintf("fc%d.", i))
	}
	_, all := planJSON(t, args...)
	_, first := planJSON(t, append(args, "--freeze", "fc1.,fc2.")...)
	_, mid := planJSON(t, append(args, "--freeze", strings.Join(middle, ","))...)
	// Half the layers frozen in the middle: their weight products (a sixth
	// of the model's) are not computed; the update's saving alone is 2%.
	if first.Spec != all.Spec || mid.Spec != all.Spec || !(first.StepTime < all.StepTime && mid.StepTime < 0.92*all.StepTime) {
		t.Fatalf("steps %g (%s), frozen first layers %g (%s), frozen middle %g (%s)", all.StepTime, all.Spec,
			first.StepTime, first.Spec, mid.StepTime, mid.Spec)
	}
	var stdout, stderr bytes.Buffer
	if code := run(append([]string{"plan", "--freeze", "encoder."}, args...), &stdout, &stderr); code == 0 ||
		!strings.Contains(stderr.String(), `"encoder."`) {
		t.Fatalf("a prefix of nothing: exit %d: %s", code, stderr.String())
	}
}

// planJSON runs `ppnode plan` with args (which include --json) and returns
// its output and the JSON of its last line.
func planJSON(t *testing.T, args ...string) (string, planResult) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	if code := run(append([]string{"plan"}, args...), &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	text := stdout.String()
	lines := strings.Split(strings.TrimSpace(text), "\n")
	var pr planResult
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &pr); err != nil {
		t.Fatal(err)
	}
	return text, pr
}
