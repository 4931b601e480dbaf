package balance

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"io"
	"strings"
	"testing"

	"github.com/ppnode/ppnode/nn/zoo"
)

// The Gantt chart is well-formed SVG with a box per forward and backward
// pass, and the trace is JSON with an event per instruction and transfer.
func TestGanttAndTrace(t *testing.T) {
	g := build(t, "mlp32", zoo.Options{Width: 64})
	c := &Cluster{Nodes: []NodeProfile{{Name: "a", Speed: 1}, {Name: "b", Speed: 1}, {Name: "c", Speed: 1}, {Name: "d", Speed: 1}}}
	rec, err := Search(g, Analytic(g, AnalyticOptions{}), c, Options{Partitioner: Uniform, Schedule: "1f1b", Batch: 32, MicroBatches: 8, Recompute: RecomputeAll})
	if err != nil {
		t.Fatal(err)
	}
	var recSVG bytes.Buffer
	if err := WriteSVG(&recSVG, rec.Plan, rec.Report); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(recSVG.String(), " recompute "); n != 4*8 {
		t.Fatalf("SVG of a recomputing plan has %d recomputation boxes, want %d", n, 4*8)
	}
	zb, err := Search(g, Analytic(g, AnalyticOptions{}), c, Options{Partitioner: Uniform, Schedule: "zb", Batch: 32, MicroBatches: 8})
	if err != nil {
		t.Fatal(err)
	}
	var zbSVG bytes.Buffer
	if err := WriteSVG(&zbSVG, zb.Plan, zb.Report); err != nil {
		t.Fatal(err)
	}
	if b, w := strings.Count(zbSVG.String(), " backward_input "), strings.Count(zbSVG.String(), " weight "); b != 4*8 || w != 4*8 {
		t.Fatalf("SVG of a zb plan has %d input and %d weight gradient boxes, want %d each", b, w, 4*8)
	}
	res, err := Search(g, Analytic(g, AnalyticOptions{}), c, Options{Partitioner: Uniform, Schedule: "1f1b", Batch: 32, MicroBatches: 8})
	if err != nil {
		t.Fatal(err)
	}
	var svg bytes.Buffer
	if err := WriteSVG(&svg, res.Plan, res.Report); err != nil {
		t.Fatal(err)
	}
	dec := xml.NewDecoder(bytes.NewReader(svg.Bytes()))
	passes := 0
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("SVG is not XML: %v", err)
		}
		if cd, ok := tok.(xml.CharData); ok && (strings.Contains(string(cd), " forward ") || strings.Contains(string(cd), " backward ")) {
			passes++
		}
	}
	if want := 2 * 4 * 8; passes != want {
		t.Fatalf("SVG has %d pass boxes, want %d", passes, want)
	}
	var tr bytes.Buffer
	if err := WriteTrace(&tr, res.Plan, res.Report); err != nil {
		t.Fatal(err)
	}
	var doc struct {
		TraceEvents []struct {
			Ph  string  `json:"ph"`
			Dur float64 `json:"dur"`
		} `json:"traceEvents"`
	}
	if err := json.Unmarshal(tr.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	x := 0
	for _, e := range doc.TraceEvents {
		if e.Ph == "X" {
			x++
		}
	}
	if x != len(res.Report.Events) {
		t.Fatalf("trace has %d events, report %d", x, len(res.Report.Events))
	}
}

// A replicated plan's chart has a row per executor, named by stage and
// replica, and draws the gradient sums.
func TestGanttReplicas(t *testing.T) {
	g := build(t, "mlp32", zoo.Options{Width: 64})
	c := equalNodes(3)
	res, err := Search(g, Analytic(g, AnalyticOptions{}), c, Options{Partitioner: "fc1-fc16@a,b; fc17-fc32@c", Batch: 32, MicroBatches: 8})
	if err != nil {
		t.Fatal(err)
	}
	var svg bytes.Buffer
	if err := WriteSVG(&svg, res.Plan, res.Report); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"2 stages on 3 nodes", "s0.0 @a", "s0.1 @b", "s1.0 @c", "gradient sum s0.0→s0.1", "gradient sum s0.1→s0.0"} {
		if !strings.Contains(svg.String(), want) {
			t.Errorf("the chart lacks %q", want)
		}
	}
	if err := xml.Unmarshal(svg.Bytes(), new(struct{})); err != nil {
		t.Fatalf("SVG is not XML: %v", err)
	}
}
