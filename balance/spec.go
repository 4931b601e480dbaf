package balance

import (
	"fmt"
	"slices"
	"strings"

	"github.com/ppnode/ppnode/nn"
)

// ParseSpec reads a partition description (see the package documentation,
// "Partition descriptions"):
//
//	fc1-fc8@a; fc9-fc20@b; fc21-fc32@c
//	flatten@a; tower1.slice-tower1.fc3@b; tower2.slice-tower2.fc3@c; concat-out@d
//	conv1-layer2.3.relu3 + fc@a; layer3.0.conv1-avgpool@b
//
// Stages are separated by ';', a stage is one or more ranges joined by
// '+', optionally followed by '@node'. Stages without a node take the
// nodes no stage names, in the order of nodes. The result is validated
// (Partition.Validate).
func ParseSpec(g *nn.Graph, spec string, nodes []string) (*Partition, error) {
	pos := map[string]int{}
	for i, n := range g.Nodes {
		pos[n.Name] = i
	}
	type rng struct{ a, b int }
	type stageText struct {
		text   string
		ranges []rng
		node   string
	}
	var stages []stageText
	named := map[int]bool{} // nodes named as a range's first or last layer
	for _, seg := range strings.Split(spec, ";") {
		seg = strings.TrimSpace(seg)
		if seg == "" {
			continue
		}
		st := stageText{text: seg}
		body := seg
		if at := strings.LastIndex(seg, "@"); at >= 0 {
			body, st.node = strings.TrimSpace(seg[:at]), strings.TrimSpace(seg[at+1:])
			if st.node == "" {
				return nil, fmt.Errorf("%w: stage %d %q: '@' without a node", ErrSyntax, len(stages), seg)
			}
		}
		if body == "" {
			return nil, fmt.Errorf("%w: stage %d %q has no layers", ErrEmptyStage, len(stages), seg)
		}
		for _, r := range strings.Split(body, "+") {
			r = strings.TrimSpace(r)
			if r == "" {
				return nil, fmt.Errorf("%w: stage %d %q: empty range", ErrSyntax, len(stages), seg)
			}
			a, b, err := parseRange(r, pos)
			if err != nil {
				return nil, fmt.Errorf("stage %d %q: %w", len(stages), seg, err)
			}
			if a > b {
				return nil, fmt.Errorf("%w: stage %d: range %q is empty: %q comes after %q in the model", ErrEmptyStage, len(stages), r, g.Nodes[a].Name, g.Nodes[b].Name)
			}
			named[a], named[b] = true, true
			st.ranges = append(st.ranges, rng{a, b})
		}
		stages = append(stages, st)
	}
	if len(stages) == 0 {
		return nil, fmt.Errorf("%w: the description %q has no stages", ErrEmptyStage, spec)
	}
	cons := g.Consumers()
	taken := map[string]bool{}
	for _, st := range stages {
		if st.node != "" {
			taken[st.node] = true
		}
	}
	var free []string
	for _, n := range nodes {
		if !taken[n] {
			free = append(free, n)
		}
	}
	p := &Partition{}
	for s, st := range stages {
		ps := PartStage{Node: st.node}
		if ps.Node == "" {
			if len(free) == 0 {
				return nil, fmt.Errorf("%w: stage %d %q names no node and no node is left (have %s)", ErrUnknownNode, s, st.text, strings.Join(nodes, ", "))
			}
			ps.Node, free = free[0], free[1:]
		}
		for _, r := range st.ranges {
			end := r.b
			for end+1 < len(g.Nodes) && attached(g, cons, end+1) && !named[end+1] {
				end++
			}
			for i := r.a; i <= end; i++ {
				ps.Layers = append(ps.Layers, g.Nodes[i].Name)
			}
		}
		p.Stages = append(p.Stages, ps)
	}
	idx := map[string]int{}
	for i, n := range nodes {
		idx[n] = i
	}
	if _, err := newStageGraph(g, p, idx); err != nil {
		return nil, err
	}
	return p, nil
}

// parseRange resolves "first-last" or "layer" to node indices. Layer
// names may themselves contain '-': the split that names two layers wins.
func parseRange(r string, pos map[string]int) (int, int, error) {
	if i, ok := pos[r]; ok {
		return i, i, nil
	}
	var found [][2]int
	var bad string
	for k := 0; k < len(r); k++ {
		if r[k] != '-' {
			continue
		}
		a, b := strings.TrimSpace(r[:k]), strings.TrimSpace(r[k+1:])
		i, okA := pos[a]
		j, okB := pos[b]
		switch {
		case okA && okB:
			found = append(found, [2]int{i, j})
		case bad == "" && !okA && a != "":
			bad = a
		case bad == "" && !okB && b != "":
			bad = b
		}
	}
	switch {
	case len(found) == 1:
		return found[0][0], found[0][1], nil
	case len(found) > 1:
		return 0, 0, fmt.Errorf("%w: range %q can be read in %d ways", ErrSyntax, r, len(found))
	case bad != "":
		return 0, 0, fmt.Errorf("%w: %q is not a layer of the model", ErrUnknownLayer, bad)
	}
	return 0, 0, fmt.Errorf("%w: %q is not a layer of the model", ErrUnknownLayer, r)
}

// FormatSpec writes p as a partition description that ParseSpec reads
// back to the same partition: each stage's layers as runs of consecutive
// layers, each run as "first-last" without the attached layers that the
// range takes implicitly.
func FormatSpec(g *nn.Graph, p *Partition) string {
	pos := map[string]int{}
	for i, n := range g.Nodes {
		pos[n.Name] = i
	}
	cons := g.Consumers()
	var parts []string
	for _, st := range p.Stages {
		idx := make([]int, 0, len(st.Layers))
		for _, n := range st.Layers {
			idx = append(idx, pos[n])
		}
		slices.Sort(idx)
		var runs []string
		for k := 0; k < len(idx); {
			e := k
			for e+1 < len(idx) && idx[e+1] == idx[e]+1 {
				e++
			}
			a, b := idx[k], idx[e]
			for b > a && attached(g, cons, b) {
				b--
			}
			if a == b {
				runs = append(runs, g.Nodes[a].Name)
			} else {
				runs = append(runs, g.Nodes[a].Name+"-"+g.Nodes[b].Name)
			}
			k = e + 1
		}
		parts = append(parts, strings.Join(runs, " + ")+"@"+st.Node)
	}
	return strings.Join(parts, "; ")
}
