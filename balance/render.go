package balance

import (
	"encoding/json"
	"fmt"
	"html"
	"io"
	"math"
	"slices"
	"strings"
)

// WriteSVG draws the simulated step of p as a Gantt chart: one row per
// executor, a box per forward (blue) and backward (green) pass labelled
// with its micro-batch, the optimizer step in grey, and one thin row per
// link with its transfers (gradient sums in purple), on a time axis in
// milliseconds. An executor is a stage, or a replica ("s1.0") of a stage
// with replicas; under the interleaved schedule it is a node, whose row
// holds all its chunks, told apart by shade and labelled "chunk.micro":
// the node runs one pass at a time, so its row shows its bubble, where
// rows per chunk would show as idle the time the node spends on its
// other chunks.
func WriteSVG(w io.Writer, p *Plan, r *Report) error {
	const (
		width  = 1400.0
		left   = 190.0
		right  = 20.0
		top    = 56.0
		rowH   = 30.0
		linkH  = 12.0
		legend = 40.0
	)
	S := len(p.Stages)
	row := func(s int) int { return s }
	rows := S
	if p.Schedule == Interleaved && p.Chunks > 1 {
		rows = S / p.Chunks
		row = func(s int) int { return s % rows }
	}
	links := map[[2]int]int{}
	var linkRows [][2]int
	for _, e := range r.Events {
		if e.Link() {
			k := [2]int{e.Stage, e.Peer}
			if _, ok := links[k]; !ok {
				links[k] = len(linkRows)
				linkRows = append(linkRows, k)
			}
		}
	}
	height := top + float64(rows)*rowH + 16 + float64(len(linkRows))*linkH + 30 + legend
	span := r.StepTime
	if span <= 0 {
		span = 1
	}
	x := func(t float64) float64 { return left + (width-left-right)*t/span }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" font-family="sans-serif" font-size="11">`+"\n", width, height, width, height)
	fmt.Fprintf(&b, `<rect x="0" y="0" width="%.0f" height="%.0f" fill="white"/>`+"\n", width, height)
	stages := fmt.Sprintf("%d stages", S)
	if p.Replicated() {
		stages = fmt.Sprintf("%d stages on %d nodes", p.Stages[S-1].Group+1, S)
	}
	if rows < S {
		stages = fmt.Sprintf("%d stages on %d nodes, %d chunks each", S, rows, p.Chunks)
	}
	title := fmt.Sprintf("%s %s, %s, M=%d micro-batches of %d: step %.2f ms, bubble %.1f%%, %.0f samples/s",
		p.Model, p.ScheduleText(), stages, p.MicroBatches, p.MicroBatchSize, r.StepTime*1e3, 100*r.BubbleFraction, r.Throughput)
	fmt.Fprintf(&b, `<text x="%.0f" y="22" font-size="15" font-weight="bold">%s</text>`+"\n", left, html.EscapeString(strings.TrimSpace(title)))
	// Time axis.
	step := niceStep(span * 1e3 / 10)
	axisY := top + float64(rows)*rowH + 4
	for t := 0.0; t <= span*1e3+1e-9; t += step {
		xx := x(t / 1e3)
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", xx, top-6, xx, axisY)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle" fill="#555">%s ms</text>`+"\n", xx, top-10, trimFloat(t))
	}
	for s, st := range p.Stages[:rows] {
		y := top + float64(s)*rowH
		label := execName(p, s) + " @" + st.Node
		var chunks []string
		busy := 0.0
		for k := s; k < S; k += rows {
			chunks = append(chunks, execName(p, k))
			if k < len(r.Stages) {
				busy += r.Stages[k].BusyFraction
			}
		}
		if rows < S {
			label = st.Node + ": " + strings.Join(chunks, ",")
		}
		if s < len(r.Stages) {
			label += fmt.Sprintf("  busy %.0f%%", 100*busy)
		}
		fmt.Fprintf(&b, `<text x="8" y="%.1f">%s</text>`+"\n", y+rowH/2+4, html.EscapeString(label))
		fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="#f6f6f6"/>`+"\n", left, y+2, width-left-right, rowH-4)
	}
	for _, e := range r.Events {
		if e.Link() || e.End <= e.Start {
			continue
		}
		y := top + float64(row(e.Stage))*rowH
		fill, text := "#9e9e9e", "step"
		switch e.Op {
		case OpForward:
			fill, text = shade("#4e79a7", "#2f5b8a", e.Micro), fmt.Sprint(e.Micro)
		case OpBackward, OpBackwardInput:
			fill, text = shade("#59a14f", "#3d7f35", e.Micro), fmt.Sprint(e.Micro)
		}
		if c := e.Stage / rows; rows < S && e.Op != OpStep {
			// Chunks alternate dark and light; the label names the chunk.
			fill = map[Op][2]string{OpForward: {"#2f5b8a", "#8db3dc"}, OpBackward: {"#3d7f35", "#9fd194"}}[e.Op][c%2]
			text = fmt.Sprintf("%d.%d", c, e.Micro)
		}
		switch e.Op {
		case OpWeight:
			fill, text = shade("#edc948", "#c9a227", e.Micro), fmt.Sprint(e.Micro)
		case OpRecompute:
			fill, text = shade("#76b7b2", "#4f8f8a", e.Micro), fmt.Sprint(e.Micro)
		}
		x0, x1 := x(e.Start), x(e.End)
		fmt.Fprintf(&b, `<rect x="%.2f" y="%.1f" width="%.2f" height="%.1f" fill="%s" stroke="white" stroke-width="0.5"><title>stage %d %s %d: %.3f-%.3f ms</title></rect>`+"\n",
			x0, y+3, math.Max(x1-x0, 0.5), rowH-6, fill, e.Stage, e.Op, e.Micro, e.Start*1e3, e.End*1e3)
		if x1-x0 > 7*float64(len(text))+2 {
			fmt.Fprintf(&b, `<text x="%.2f" y="%.1f" text-anchor="middle" fill="white">%s</text>`+"\n", (x0+x1)/2, y+rowH/2+4, text)
		}
	}
	ly := top + float64(rows)*rowH + 16
	for k, lk := range linkRows {
		y := ly + float64(k)*linkH
		fmt.Fprintf(&b, `<text x="8" y="%.1f" font-size="9" fill="#555">link %s→%s</text>`+"\n", y+9, execName(p, lk[0]), execName(p, lk[1]))
	}
	for _, e := range r.Events {
		if !e.Link() {
			continue
		}
		y := ly + float64(links[[2]int{e.Stage, e.Peer}])*linkH
		fill, what := "#f28e2b", fmt.Sprintf("%s %d", e.Op, e.Micro)
		switch e.Op {
		case OpSendGrad:
			fill = "#e15759"
		case OpSendSum:
			fill, what = "#b07aa1", "gradient sum"
		case OpSendTie:
			fill, what = "#b07aa1", "tied gradients"
		}
		x0, x1 := x(e.Start), x(e.End)
		fmt.Fprintf(&b, `<rect x="%.2f" y="%.1f" width="%.2f" height="%.1f" fill="%s" opacity="0.8"><title>%s %s→%s %.0f bytes</title></rect>`+"\n",
			x0, y+2, math.Max(x1-x0, 0.5), linkH-3, fill, what, execName(p, e.Stage), execName(p, e.Peer), e.Bytes)
	}
	lgY := height - legend + 10
	items := []struct{ fill, name string }{{"#4e79a7", "forward m"}, {"#59a14f", "backward m"}, {"#9e9e9e", "optimizer step"}, {"#f28e2b", "activation transfer"}, {"#e15759", "gradient transfer"}}
	if p.Replicated() {
		items = append(items, struct{ fill, name string }{"#b07aa1", "gradient sum"})
	}
	if p.Schedule == ZeroBubble {
		items[1].name = "input gradients m"
		items = append(items, struct{ fill, name string }{"#edc948", "weight gradients m"})
	}
	if slices.ContainsFunc(p.Stages, func(s StagePlan) bool { return s.Recompute }) {
		items = append(items, struct{ fill, name string }{"#76b7b2", "recompute m"})
	}
	for k, it := range items {
		xx := left + float64(k)*170
		fmt.Fprintf(&b, `<rect x="%.0f" y="%.0f" width="14" height="14" fill="%s"/><text x="%.0f" y="%.0f">%s</text>`+"\n", xx, lgY, it.fill, xx+20, lgY+11, it.name)
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// execName names executor e of p: "s3", or "s1.0" for replica 0 of stage
// 1 in a plan with replicas.
func execName(p *Plan, e int) string {
	if e < 0 || e >= len(p.Stages) {
		return fmt.Sprintf("s%d", e)
	}
	if p.Replicated() {
		return fmt.Sprintf("s%d.%d", p.Stages[e].Group, p.Stages[e].Replica)
	}
	return fmt.Sprintf("s%d", e)
}

func shade(a, b string, m int) string {
	if m%2 == 0 {
		return a
	}
	return b
}

// niceStep rounds a tick interval to 1, 2 or 5 times a power of ten.
func niceStep(v float64) float64 {
	if v <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if v <= m*p {
			return m * p
		}
	}
	return 10 * p
}

func trimFloat(v float64) string {
	s := fmt.Sprintf("%.3f", v)
	s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	return s
}

// WriteTrace writes the simulated step as a Chrome trace (the JSON that
// chrome://tracing and Perfetto open): one thread per stage, one per link,
// times in microseconds.
func WriteTrace(w io.Writer, p *Plan, r *Report) error {
	type ev struct {
		Name string         `json:"name"`
		Cat  string         `json:"cat,omitempty"`
		Ph   string         `json:"ph"`
		Ts   float64        `json:"ts"`
		Dur  float64        `json:"dur,omitempty"`
		Pid  int            `json:"pid"`
		Tid  int            `json:"tid"`
		Args map[string]any `json:"args,omitempty"`
	}
	var evs []ev
	evs = append(evs, ev{Name: "process_name", Ph: "M", Pid: 1, Args: map[string]any{"name": "stages"}},
		ev{Name: "process_name", Ph: "M", Pid: 2, Args: map[string]any{"name": "links"}})
	for s, st := range p.Stages {
		evs = append(evs, ev{Name: "thread_name", Ph: "M", Pid: 1, Tid: s, Args: map[string]any{"name": execName(p, s) + " @" + st.Node}})
	}
	links := map[[2]int]int{}
	for _, e := range r.Events {
		if e.Link() {
			k := [2]int{e.Stage, e.Peer}
			if _, ok := links[k]; !ok {
				links[k] = len(links)
				evs = append(evs, ev{Name: "thread_name", Ph: "M", Pid: 2, Tid: links[k], Args: map[string]any{"name": execName(p, e.Stage) + "->" + execName(p, e.Peer)}})
			}
		}
	}
	for _, e := range r.Events {
		if e.Link() {
			name := fmt.Sprintf("%s %d", e.Op, e.Micro)
			switch e.Op {
			case OpSendSum:
				name = "gradient sum"
			case OpSendTie:
				name = "tied gradients"
			}
			evs = append(evs, ev{Name: name, Cat: "transfer", Ph: "X", Ts: e.Start * 1e6, Dur: (e.End - e.Start) * 1e6,
				Pid: 2, Tid: links[[2]int{e.Stage, e.Peer}], Args: map[string]any{"bytes": e.Bytes, "micro": e.Micro}})
			continue
		}
		name := e.Op.String()
		if e.Op != OpStep {
			name = fmt.Sprintf("%s %d", e.Op, e.Micro)
		}
		evs = append(evs, ev{Name: name, Cat: e.Op.String(), Ph: "X", Ts: e.Start * 1e6, Dur: (e.End - e.Start) * 1e6, Pid: 1, Tid: e.Stage,
			Args: map[string]any{"micro": e.Micro}})
	}
	return json.NewEncoder(w).Encode(map[string]any{"traceEvents": evs, "displayTimeUnit": "ms"})
}
