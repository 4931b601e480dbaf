package onnx_test

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/ppnode/ppnode/nn"
	"github.com/ppnode/ppnode/onnx"
	"github.com/ppnode/ppnode/onnx/onnxpb"
)

// testdata/convnet.onnx and towers.onnx are testdata/torch_onnx.py's
// exports (convnet: grouped, dilated and depthwise convolutions, padding,
// average pooling, x.view(x.size(0), -1); towers: slices, a constant
// product, BatchNorm1d, concatenation, LogSoftmax).
// The others are its exports of python/ppnode_models.py's families at test
// sizes (`torch_onnx.py MODEL DIR`, DIR/model.onnx).
var models = map[string][]onnx.Input{
	"testdata/convnet.onnx":     feats([]int{4, 9, 7}),
	"testdata/towers.onnx":      feats([]int{24}),
	"testdata/gpt.onnx":         {{Name: "x", Shape: []int{6}, Int: true}},
	"testdata/dlrm.onnx":        {{Name: "x0", Shape: []int{5}}, {Name: "x1", Shape: []int{3}, Int: true}},
	"testdata/twotower.onnx":    {{Name: "x0", Shape: []int{2, 8, 8}}, {Name: "x1", Shape: []int{5}, Int: true}},
	"testdata/transformer.onnx": {{Name: "x", Shape: []int{6}, Int: true}},
	"testdata/vit.onnx":         feats([]int{2, 8, 8}),
	"testdata/lstm.onnx":        feats([]int{5, 3}),
	"testdata/gru.onnx":         feats([]int{5, 3}),
	"testdata/bilstm.onnx":      feats([]int{5, 3}),
	"testdata/bigru.onnx":       feats([]int{5, 3}),
	"testdata/rnn.onnx":         feats([]int{5, 3}),
	"testdata/autoencoder.onnx": feats([]int{2, 16, 16}),
	"testdata/misc.onnx":        feats([]int{2, 6, 6}),
	"testdata/textcnn.onnx":     {{Name: "x", Shape: []int{8}, Int: true}},
	"testdata/einsum.onnx":      {{Name: "x", Shape: []int{6}, Int: true}},
	"testdata/tiedgpt.onnx":     {{Name: "x", Shape: []int{6}, Int: true}},
	"testdata/albert.onnx":      {{Name: "x", Shape: []int{6}, Int: true}},
	"testdata/lasttoken.onnx":   {{Name: "x", Shape: []int{6}, Int: true}},
	"testdata/siamese.onnx":     {{Name: "x0", Shape: []int{6}}, {Name: "x1", Shape: []int{6}}},
}

// A GPT whose head is tied to its token embedding imports as two copies of
// tok.weight, one tied group, known also by the head's name that the file's
// metadata gives (the state_dict's).
func TestTiedCopies(t *testing.T) {
	md, err := onnx.Import(read(t, "testdata/tiedgpt.onnx"), onnx.Options{Inputs: models["testdata/tiedgpt.onnx"]})
	if err != nil {
		t.Fatal(err)
	}
	ties := nn.Ties(md.Graph.Params())
	if len(ties) != 1 || len(ties[0]) != 2 || ties[0][0].Name != "tok.weight" {
		t.Fatalf("ties %v, want tok.weight twice", ties)
	}
	for _, p := range ties[0] {
		if !slices.Equal(p.Aliases, []string{"head.weight"}) || !slices.Equal(p.Given, ties[0][0].Given) {
			t.Errorf("copy of %s: aliases %v, its start equal to the first's: %v", p.Name, p.Aliases, slices.Equal(p.Given, ties[0][0].Given))
		}
	}
	// Metadata that names another tensor, or one name twice, is refused.
	for _, bad := range []string{"tok.weight=pos.weight", "tok.weight=head.weight=head.weight"} {
		m := read(t, "testdata/tiedgpt.onnx")
		for _, p := range m.GetMetadataProps() {
			if p.GetKey() == onnx.TiedKey {
				p.Value = &bad
			}
		}
		_, err := onnx.Import(m, onnx.Options{Inputs: models["testdata/tiedgpt.onnx"]})
		if !errors.Is(err, onnx.ErrModel) || !strings.Contains(err.Error(), onnx.TiedKey) {
			t.Errorf("%s = %q: %v, want onnx.ErrModel naming the key", onnx.TiedKey, bad, err)
		}
	}
}

// Every parameter is written out in its initializer's shape (a Conv1d's
// weight is [Out, In, K], not the 2-D convolution's that computes it), so
// that the module loads --out with strict=True.
func TestParametersKeepTheirShapes(t *testing.T) {
	for path, inputs := range models {
		m := read(t, path)
		dims := map[string][]int{}
		for _, in := range m.GetGraph().GetInitializer() {
			for _, d := range in.GetDims() {
				dims[in.GetName()] = append(dims[in.GetName()], int(d))
			}
		}
		md, err := onnx.Import(m, onnx.Options{Inputs: inputs})
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		for _, p := range md.Graph.Params() {
			if want, ok := dims[p.Name]; ok && !slices.Equal(p.ExportedShape(), want) {
				t.Errorf("%s: %s written as %v, the file has %v", path, p.Name, p.ExportedShape(), want)
			}
		}
	}
}

func read(t testing.TB, path string) *onnxpb.ModelProto {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	m, err := onnx.Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestImport(t *testing.T) {
	md, err := onnx.Read("testdata/convnet.onnx", onnx.Options{Inputs: feats([]int{4, 9, 7})})
	if err != nil {
		t.Fatal(err)
	}
	var kinds, params []string
	for _, n := range md.Graph.Nodes {
		kinds = append(kinds, n.Layer.Kind())
	}
	for _, p := range md.Graph.Params() {
		params = append(params, p.Name+fmt.Sprint(p.ExportedShape()))
	}
	if got, want := strings.Join(kinds, " "), "permute conv2d relu conv2d relu add pad2d avgpool2d permute reshape linear"; got != want {
		t.Errorf("layers %q, want %q", got, want)
	}
	if got, want := strings.Join(params, " "), "conv1.weight[8 2 3 2] conv1.bias[8] conv2.weight[8 1 3 3] conv2.bias[8] fc.weight[5 72] fc.bias[5]"; got != want {
		t.Errorf("parameters %q, want %q", got, want)
	}
	if md.Classes != 5 || md.ChannelAxes[0] != 0 {
		t.Errorf("classes %d, channel axis %d", md.Classes, md.ChannelAxes)
	}
	// NHWC images feed the same model without the first permutation.
	md, err = onnx.Read("testdata/convnet.onnx", onnx.Options{Inputs: feats([]int{9, 7, 4})})
	if err != nil {
		t.Fatal(err)
	}
	if k := md.Graph.Nodes[0].Layer.Kind(); k != "conv2d" || md.ChannelAxes[0] != 2 {
		t.Errorf("NHWC input: first layer %s, channel axis %d", k, md.ChannelAxes)
	}
	md.Graph.Init(1)
	w := md.Graph.Params()[0]
	if !w.Trainable() || w.Value.Shape()[3] != 2 || nn.F32(w.Value)[0] == 0 {
		t.Errorf("conv1.weight is %v (OHWI), starting at %v", w.Value.Shape(), nn.F32(w.Value)[:2])
	}
}

// Bad models are refused with an error that says what and where, never a
// panic.
func TestBadModels(t *testing.T) {
	base := read(t, "testdata/towers.onnx")
	withOp := func(op string) []byte {
		m := proto.Clone(base).(*onnxpb.ModelProto)
		m.Graph.Node[len(m.Graph.Node)-1].OpType = proto.String(op)
		b, _ := proto.Marshal(m)
		return b
	}
	good, _ := proto.Marshal(base)
	noInit := proto.Clone(base).(*onnxpb.ModelProto)
	noInit.Graph.Initializer = noInit.Graph.Initializer[1:]
	noInitB, _ := proto.Marshal(noInit)
	for _, c := range []struct {
		name  string
		b     []byte
		input []int
		want  []string
	}{
		{"unsupported op", withOp("Det"), []int{24}, []string{"operator Det", "/LogSoftmax", "ppnode supports", "Conv", "Gemm"}},
		{"truncated", good[:len(good)/2], []int{24}, []string{"truncated or corrupt"}},
		{"empty", nil, []int{24}, []string{"no graph"}},
		{"text", []byte("this is not a model"), []int{24}, []string{"not an ONNX model"}},
		{"other data", good, []int{5, 5}, []string{"samples of shape [24]", "[5 5]"}},
		{"missing initializer", noInitB, []int{24}, []string{"a1.weight"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			m, err := onnx.Parse(c.b)
			if err == nil {
				_, err = onnx.Import(m, onnx.Options{Inputs: feats(c.input)})
			}
			if !errors.Is(err, onnx.ErrModel) && c.name != "missing initializer" || err == nil {
				t.Fatalf("error %v, want onnx.ErrModel", err)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

// FuzzImport: whatever the bytes, Parse and Import return a graph or an
// error, and never panic.
func FuzzImport(f *testing.F) {
	for path := range models {
		b, err := os.ReadFile(path)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
		f.Add(b[:len(b)*2/3])
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := onnx.Parse(b)
		if err != nil {
			return
		}
		for _, inputs := range models {
			md, err := onnx.Import(m, onnx.Options{Inputs: inputs})
			if err == nil {
				md.Graph.Init(1)
			} else if !errors.Is(err, onnx.ErrModel) || strings.Contains(err.Error(), "could not be imported") {
				t.Fatalf("%v (want onnx.ErrModel, no panic recovered)", err)
			}
		}
	})
}

// feats is the data of one input of features of the given shape.
func feats(shape []int) []onnx.Input { return []onnx.Input{{Name: "x", Shape: shape}} }
