package nn_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/ppnode/ppnode/nn/zoo"
)

// Freeze marks the parameters its prefixes name, and the layers before
// the first trainable one need no gradient; a prefix that names nothing,
// or freezing everything, is refused.
func TestFreeze(t *testing.T) {
	g, err := zoo.Build("mlp32", zoo.Options{Width: 8, Input: []int{6}, Classes: 3})
	if err != nil {
		t.Fatal(err)
	}
	all := g.ParamCount()
	if err := g.Freeze([]string{"fc1.", "fc2.weight"}); err != nil {
		t.Fatal(err)
	}
	var frozen []string
	for _, p := range g.Params() {
		if p.Frozen {
			frozen = append(frozen, p.Name)
		}
	}
	if !slices.Equal(frozen, []string{"fc1.weight", "fc1.bias", "fc2.weight"}) || g.ParamCount() != all-(6*8+8+8*8) {
		t.Fatalf("frozen %v, %d trainable of %d", frozen, g.ParamCount(), all)
	}
	for _, n := range g.Nodes {
		if want := n.Name != "fc1" && n.Name != "relu1"; n.RequiresGrad != want {
			t.Errorf("node %s needs a gradient: %v, want %v", n.Name, n.RequiresGrad, want)
		}
	}
	if err := g.Freeze([]string{"decoder."}); err == nil || !strings.Contains(err.Error(), `no trainable parameter's name starts with "decoder."`) {
		t.Errorf("a prefix of nothing: %v", err)
	}
	if err := g.Freeze([]string{"fc"}); err == nil || !strings.Contains(err.Error(), "leaves nothing to train") {
		t.Errorf("everything frozen: %v", err)
	}
}
