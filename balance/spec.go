package balance

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/ppnode/ppnode/nn"
)

// ParseSpec reads a partition description (see the package documentation,
// "Partition descriptions"):
//
//	fc1-fc8@a; fc9-fc20@b; fc21-fc32@c
//	flatten@a; tower1.slice-tower1.fc3@b; tower2.slice-tower2.fc3@c; concat-out@d
//	conv1-layer2.3.relu3 + fc@a; layer3.0.conv1-avgpool@b
//	fc1-fc16@a,b; fc17-fc32@c
//	fc1-fc16@a:3,b:1; fc17-fc32@c
//	fc1-fc8@a; fc9-fc16@b; fc17-fc24@a; fc25-fc32@b
//
// Stages are separated by ';', a stage is one or more ranges joined by
// '+', optionally followed by '@' and its nodes: one, or several
// separated by ',' (replicas, see PartStage), each optionally with its
// share of the micro-batches after ':' (all or none). Stages without a
// node take the nodes no stage names, in the order of nodes. Stages that
// name their nodes in a cycle, P nodes for P×v stages, are the chunks of an
// interleaved partition (Partition.Chunks = v). The result is validated
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
		nodes  []string
		shares []int
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
			body = strings.TrimSpace(seg[:at])
			var err error
			if st.nodes, st.shares, err = parseNodeList(strings.TrimSpace(seg[at+1:])); err != nil {
				return nil, fmt.Errorf("%w: stage %d %q: %v", ErrSyntax, len(stages), seg, err)
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
		for _, n := range st.nodes {
			taken[n] = true
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
		ps := PartStage{Shares: st.shares}
		if len(st.nodes) > 0 {
			ps.Node = st.nodes[0]
			if len(st.nodes) > 1 {
				ps.Replicas = st.nodes[1:]
			}
		} else {
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
	// A node named by several stages holds them as chunks (the
	// interleaved schedule): S stages on P distinct nodes, P dividing S.
	distinct := map[string]bool{}
	for _, st := range p.Stages {
		distinct[st.Node] = true
	}
	if P := len(distinct); P >= 2 && P < len(p.Stages) && len(p.Stages)%P == 0 {
		p.Chunks = len(p.Stages) / P
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

// parseNodeList reads "a", "a,b" or "a:3,b:1": the nodes of a stage and
// their shares (nil when none is given).
func parseNodeList(list string) ([]string, []int, error) {
	if list == "" {
		return nil, nil, fmt.Errorf("'@' without a node")
	}
	var nodes []string
	var shares []int
	given := strings.Contains(list, ":")
	for _, f := range strings.Split(list, ",") {
		name, share, has := strings.Cut(f, ":")
		name = strings.TrimSpace(name)
		if name == "" {
			return nil, nil, fmt.Errorf("empty node name in %q", list)
		}
		if has != given {
			return nil, nil, fmt.Errorf("node %q: give every node a share or none", name)
		}
		if has {
			n, err := strconv.Atoi(strings.TrimSpace(share))
			if err != nil || n < 1 {
				return nil, nil, fmt.Errorf("node %q: share %q is not a positive number of micro-batches", name, strings.TrimSpace(share))
			}
			shares = append(shares, n)
		}
		nodes = append(nodes, name)
	}
	if len(nodes) == 1 && shares != nil {
		return nil, nil, fmt.Errorf("node %q has a share but the stage has no replicas", nodes[0])
	}
	return nodes, shares, nil
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
// range takes implicitly, then its nodes, with their shares if the stage
// gives them.
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
		var at []string
		for r, n := range st.Nodes() {
			if len(st.Shares) > 0 {
				n += ":" + strconv.Itoa(st.Shares[r])
			}
			at = append(at, n)
		}
		parts = append(parts, strings.Join(runs, " + ")+"@"+strings.Join(at, ","))
	}
	return strings.Join(parts, "; ")
}
