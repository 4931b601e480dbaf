package balance

import (
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/ppnode/ppnode/nn"
	"github.com/ppnode/ppnode/nn/zoo"
)

// fanModel is x -> fc0, read by fc1, fc2 and fc3, joined by concat into
// out: one tensor with three consumers whose gradient needs care.
func fanModel(t *testing.T) *nn.Graph {
	b := nn.NewBuilder()
	x := b.Input("x", 4)
	h := b.Add("fc0", nn.NewLinear(4, 4), x)
	var br []string
	for _, n := range []string{"fc1", "fc2", "fc3"} {
		br = append(br, b.Add(n, nn.NewLinear(4, 4), h))
	}
	c := b.Add("concat", &nn.Concat{}, br...)
	g, err := b.Build(b.Add("out", nn.NewLinear(12, 2), c))
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// Every way a partition description can be wrong is rejected with the
// sentinel and a message that names the culprit.
func TestSpecValidation(t *testing.T) {
	mlp := build(t, "mlp32", zoo.Options{Width: 8, Input: []int{4, 4, 1}})
	uno := build(t, "uno", zoo.Options{Width: 0.01, Input: []int{6, 6, 1}})
	fan := fanModel(t)
	nodes := []string{"a", "b", "c", "d"}
	for _, c := range []struct {
		name string
		g    *nn.Graph
		spec string
		err  error
		msg  string
	}{
		{"missing layer", mlp, "fc1-fc8@a; fc10-fc32@b", ErrMissingLayer, `"fc9"`},
		{"layer in two stages", mlp, "fc1-fc10@a; fc9-fc32@b", ErrDuplicateLayer, `"fc9"`},
		{"layer twice in a stage", mlp, "fc1-fc10 + fc5@a; fc11-fc32@b", ErrDuplicateLayer, `"fc5"`},
		{"unknown node", mlp, "fc1-fc16@a; fc17-fc32@z", ErrUnknownNode, `"z"`},
		{"node holds two stages", mlp, "fc1-fc16@a; fc17-fc32@a", ErrNodeReused, `"a"`},
		{"empty stage", mlp, "fc1-fc32@a; @b", ErrEmptyStage, "stage 1"},
		{"reversed range", mlp, "fc9-fc3@a", ErrEmptyStage, `"fc9" comes after "fc3"`},
		{"unknown layer", mlp, "fc1-fc99@a", ErrUnknownLayer, `"fc99"`},
		{"no node left", mlp, "fc1-fc8; fc9-fc16; fc17-fc24; fc25-fc30; fc31-fc32", ErrUnknownNode, "no node is left"},
		{"missing node name", mlp, "fc1-fc32@", ErrSyntax, "'@'"},
		{"empty range", mlp, "fc1-fc8 + @a; fc9-fc32@b", ErrSyntax, "empty range"},
		{"cycle", uno, "flatten + concat-out@a; tower1.slice-tower3.relu3@b", ErrCycle, `layer "concat" of stage 0 reads "tower1.relu3" of stage 1`},
		{"gradient order", fan, "fc0@a; fc1 + fc3@b; fc2@c; concat-out@d", ErrGradientOrder, `"fc0"`},
		{"empty replica name", mlp, "fc1-fc16@a,; fc17-fc32@c", ErrSyntax, `stage 0 "fc1-fc16@a,": empty node name`},
		{"some shares", mlp, "fc1-fc16@a:3,b; fc17-fc32@c", ErrSyntax, `node "b": give every node a share or none`},
		{"zero share", mlp, "fc1-fc16@a:0,b:4; fc17-fc32@c", ErrSyntax, `node "a": share "0"`},
		{"share not a number", mlp, "fc1-fc16@a:1,b:x; fc17-fc32@c", ErrSyntax, `node "b": share "x"`},
		{"share without replicas", mlp, "fc1-fc16@a:4; fc17-fc32@c", ErrSyntax, `node "a" has a share but the stage has no replicas`},
		{"replica named twice", mlp, "fc1-fc16@a,b,a; fc17-fc32@c", ErrNodeReused, `node "a" is named twice in stage 0`},
		{"replica holds a stage", mlp, "fc1-fc16@a,b; fc17-fc32@b", ErrNodeReused, `node "b" holds stages 0 and 1`},
		{"unknown replica", mlp, "fc1-fc16@a,z; fc17-fc32@b", ErrUnknownNode, `stage 0 is placed on node "z"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := ParseSpec(c.g, c.spec, nodes)
			if !errors.Is(err, c.err) || !strings.Contains(err.Error(), c.msg) {
				t.Fatalf("ParseSpec(%q) = %v; want %v mentioning %s", c.spec, err, c.err, c.msg)
			}
		})
	}
}

// The range rule: a range takes the parameter-free layers that follow its
// last layer, unless another range names them.
func TestSpecRanges(t *testing.T) {
	mlp := build(t, "mlp32", zoo.Options{Width: 8, Input: []int{4, 4, 1}})
	nodes := []string{"a", "b", "c"}
	p, err := ParseSpec(mlp, "fc1-fc8@a; fc9-fc20@b; fc21-fc32@c", nodes)
	if err != nil {
		t.Fatal(err)
	}
	if st := p.Stages[0]; st.Node != "a" || len(st.Layers) != 16 || st.Layers[15] != "relu8" {
		t.Fatalf("stage 0 = %+v, want fc1..relu8 on a", st)
	}
	p, err = ParseSpec(mlp, "fc1-fc8@b; relu8-fc32", nodes)
	if err != nil {
		t.Fatal(err)
	}
	if p.Stages[0].Layers[14] != "fc8" || len(p.Stages[0].Layers) != 15 || p.Stages[1].Layers[0] != "relu8" || p.Stages[1].Node != "a" {
		t.Fatalf("stages %v", p.Stages)
	}
	fan := fanModel(t)
	if _, err := ParseSpec(fan, "fc0@a; fc2 + fc3@b; fc1@c; concat-out@d", []string{"a", "b", "c", "d"}); err != nil {
		t.Fatalf("a partition whose gradients sum in order is rejected: %v", err)
	}
}

// FormatSpec and ParseSpec are inverses on every partitioner's output.
func TestSpecRoundTrip(t *testing.T) {
	for _, m := range []struct {
		name string
		o    zoo.Options
	}{
		{"mlp32", zoo.Options{Width: 16}},
		{"uno", zoo.Options{Width: 0.1}},
		{"resnet50", zoo.Options{Width: 0.125, Input: []int{16, 16, 3}}},
		{"vgg16", zoo.Options{Width: 0.125, Input: []int{16, 16, 3}}},
	} {
		g := build(t, m.name, m.o)
		prof := Analytic(g, AnalyticOptions{})
		c := &Cluster{Nodes: []NodeProfile{{Name: "a", Speed: 1}, {Name: "b", Speed: 0.5}, {Name: "c", Speed: 0.25}, {Name: "d", Speed: 1}}}
		for _, part := range []string{Uniform, Params, Balanced, GraphPP} {
			res, err := Search(g, prof, c, Options{Partitioner: part, Batch: 16, MicroBatches: 4})
			if err != nil {
				t.Fatal(m.name, part, err)
			}
			back, err := ParseSpec(g, res.Spec, []string{"a", "b", "c", "d"})
			if err != nil {
				t.Fatalf("%s %s: %q does not parse: %v", m.name, part, res.Spec, err)
			}
			for s, st := range res.Plan.Stages {
				if !slices.Equal(back.Stages[s].Layers, st.Layers) || back.Stages[s].Node != st.Node {
					t.Fatalf("%s %s: %q parses to stage %d %v, plan has %v", m.name, part, res.Spec, s, back.Stages[s], st.Layers)
				}
			}
			// The description also drives the search.
			if _, err := Search(g, prof, c, Options{Partitioner: res.Spec, Batch: 16, MicroBatches: 4}); err != nil {
				t.Fatalf("%s: searching with %q: %v", m.name, res.Spec, err)
			}
		}
	}
}

// Replicated stages in descriptions: FormatSpec writes what ParseSpec
// read (shares only when given), and ParseSpec reads FormatSpec's output
// back to the same partition.
func TestSpecReplicas(t *testing.T) {
	mlp := build(t, "mlp32", zoo.Options{Width: 8, Input: []int{4, 4, 1}})
	uno := build(t, "uno", zoo.Options{Width: 0.02, Input: []int{6, 6, 1}})
	nodes := []string{"a", "b", "c", "d", "e"}
	for _, c := range []struct {
		g          *nn.Graph
		spec, want string
		replicas   []string // of stage 0
		shares     []int    // of stage 0
	}{
		{mlp, "fc1-fc16@a,b; fc17-fc32@c", "fc1-fc16@a,b; fc17-fc32@c", []string{"b"}, nil},
		{mlp, "fc1-fc16 @ a:3 , b:1 ; fc17-fc32@c", "fc1-fc16@a:3,b:1; fc17-fc32@c", []string{"b"}, []int{3, 1}},
		{mlp, "fc1-fc16@c,a,e; fc17-fc32", "fc1-fc16@c,a,e; fc17-fc32@b", []string{"a", "e"}, nil},
		{mlp, "fc1-fc8@a; fc9-fc32@b:2,c:2", "fc1-fc8@a; fc9-fc32@b:2,c:2", nil, nil},
		{uno, "flatten + tower1.slice-tower1.fc3@a,b; tower2.slice-tower3.fc3@c; concat-out@d:1,e:2",
			"flatten-tower1.fc3@a,b; tower2.slice-tower3.fc3@c; concat-out@d:1,e:2", []string{"b"}, nil},
	} {
		p, err := ParseSpec(c.g, c.spec, nodes)
		if err != nil {
			t.Fatalf("%q: %v", c.spec, err)
		}
		if st := p.Stages[0]; !slices.Equal(st.Replicas, c.replicas) || !slices.Equal(st.Shares, c.shares) {
			t.Fatalf("%q: stage 0 has replicas %v shares %v, want %v %v", c.spec, st.Replicas, st.Shares, c.replicas, c.shares)
		}
		got := FormatSpec(c.g, p)
		if got != c.want {
			t.Fatalf("FormatSpec(ParseSpec(%q)) = %q, want %q", c.spec, got, c.want)
		}
		back, err := ParseSpec(c.g, got, nodes)
		if err != nil || !reflect.DeepEqual(back, p) {
			t.Fatalf("%q reads back as %+v (%v), want %+v", got, back, err, p)
		}
	}
}
