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
