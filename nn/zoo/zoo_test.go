package zoo_test

import (
	"testing"

	"github.com/ppnode/ppnode/nn"
	"github.com/ppnode/ppnode/nn/nntest"
	"github.com/ppnode/ppnode/nn/zoo"
)

// Small instances of every model pass the gradient check as whole graphs.
func TestGradCheckModels(t *testing.T) {
	// Deep ReLU networks have kinks that a finite step crosses: the deep
	// models may have a few probes beyond tolerance (resnet50 is checked in
	// evaluation mode: BatchNorm over the 4 values of a 1x1 map is too
	// curved for finite differences),
	// but the median relative
	// error must stay within 5%. Their exact gradients are checked against
	// PyTorch in the parity test.
	cases := []struct {
		name string
		opt  zoo.Options
		chk  nntest.Options
	}{
		{"mlp32", zoo.Options{Width: 6, Input: []int{4, 2, 1}, Classes: 3}, nntest.Options{Eps: 1e-3, RTol: 5e-2, ATol: 1e-2}},
		{"vgg16", zoo.Options{Width: 1.0 / 32, Input: []int{4, 4, 2}, Classes: 3}, nntest.Options{Batch: 16, Eps: 3e-4, RTol: 5e-2, ATol: 1e-2, MaxBad: 0.02}},
		{"resnet50", zoo.Options{Width: 1.0 / 32, Input: []int{4, 4, 2}, Classes: 3}, nntest.Options{Eps: 1e-3, RTol: 5e-2, ATol: 1e-2, MaxBad: 0.03, Eval: true}},
		{"uno", zoo.Options{Width: 0.005, Input: []int{9}, Classes: 3}, nntest.Options{Eps: 1e-3, RTol: 5e-2, ATol: 1e-2}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			g, err := zoo.Build(c.name, c.opt)
			if err != nil {
				t.Fatal(err)
			}
			if c.chk.Batch == 0 {
				c.chk.Batch = 4
			}
			nntest.GradCheckGraph(t, g, c.chk)
		})
	}
}

func TestNames(t *testing.T) {
	g, err := zoo.Build("mlp32", zoo.Options{})
	if err != nil {
		t.Fatal(err)
	}
	linear := 0
	for _, n := range g.Nodes {
		if n.Layer.Kind() == "linear" {
			linear++
		}
	}
	if linear != 32 || g.Node("fc1") == nil || g.Node("fc32") == nil || g.Node("relu31") == nil || g.Node("relu32") != nil {
		t.Fatalf("mlp32 has %d linear layers; want fc1..fc32 and relu1..relu31", linear)
	}
	if got := g.ParamCount(); got != 784*512+512+30*(512*512+512)+512*10+10 {
		t.Fatalf("mlp32 has %d parameters", got)
	}
	r, err := zoo.Build("resnet50", zoo.Options{Width: 0.25, Input: []int{32, 32, 3}})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"layer3.1.conv2", "layer4.0.downsample.0", "fc"} {
		if r.Node(name) == nil {
			t.Errorf("resnet50 lacks %s", name)
		}
	}
	convs := 0
	for _, n := range r.Nodes {
		if _, ok := n.Layer.(*nn.Conv2D); ok {
			convs++
		}
	}
	if convs != 53 { // 1 stem + 16 blocks x 3 + 4 downsamples
		t.Fatalf("resnet50 has %d convolutions, want 53", convs)
	}
	if _, err := zoo.Build("nope", zoo.Options{}); err == nil {
		t.Fatal("unknown model accepted")
	}
}
