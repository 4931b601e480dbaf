package onnx_test

import (
	"errors"
	"math"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/ppnode/ppnode/nn"
	"github.com/ppnode/ppnode/onnx"
	"github.com/ppnode/ppnode/onnx/onnxpb"
)

// graph builds small ONNX models by hand: one float input "x" [N, features],
// nodes, float initializers, and one output.
type graph struct {
	features int
	nodes    []*onnxpb.NodeProto
	inits    []*onnxpb.TensorProto
}

func (g *graph) node(op string, ins []string, out string, attrs ...*onnxpb.AttributeProto) {
	g.nodes = append(g.nodes, &onnxpb.NodeProto{OpType: proto.String(op), Name: proto.String("/" + out), Input: ins, Output: []string{out}, Attribute: attrs})
}

func (g *graph) init(name string, dims []int64, v ...float32) {
	g.inits = append(g.inits, &onnxpb.TensorProto{Name: proto.String(name), Dims: dims,
		DataType: proto.Int32(int32(onnxpb.TensorProto_FLOAT)), FloatData: v})
}

func (g *graph) ints(name string, dims []int64, v ...int64) {
	g.inits = append(g.inits, &onnxpb.TensorProto{Name: proto.String(name), Dims: dims,
		DataType: proto.Int32(int32(onnxpb.TensorProto_INT64)), Int64Data: v})
}

func intAttr(name string, v int64) *onnxpb.AttributeProto {
	return &onnxpb.AttributeProto{Name: proto.String(name), I: proto.Int64(v), Type: onnxpb.AttributeProto_INT.Enum()}
}

func (g *graph) model(output string) *onnxpb.ModelProto {
	dim := func(v int64) *onnxpb.TensorShapeProto_Dimension {
		return &onnxpb.TensorShapeProto_Dimension{Value: &onnxpb.TensorShapeProto_Dimension_DimValue{DimValue: v}}
	}
	batch := &onnxpb.TensorShapeProto_Dimension{Value: &onnxpb.TensorShapeProto_Dimension_DimParam{DimParam: "batch"}}
	in := &onnxpb.ValueInfoProto{Name: proto.String("x"), Type: &onnxpb.TypeProto{Value: &onnxpb.TypeProto_TensorType{TensorType: &onnxpb.TypeProto_Tensor{
		ElemType: proto.Int32(int32(onnxpb.TensorProto_FLOAT)),
		Shape:    &onnxpb.TensorShapeProto{Dim: []*onnxpb.TensorShapeProto_Dimension{batch, dim(int64(g.features))}},
	}}}}
	return &onnxpb.ModelProto{
		OpsetImport: []*onnxpb.OperatorSetIdProto{{Version: proto.Int64(13)}},
		Graph: &onnxpb.GraphProto{Node: g.nodes, Initializer: g.inits, Input: []*onnxpb.ValueInfoProto{in},
			Output: []*onnxpb.ValueInfoProto{{Name: proto.String(output)}}},
	}
}

func importGraph(t *testing.T, g *graph, out string) (*onnx.Model, error) {
	t.Helper()
	b, err := proto.Marshal(g.model(out))
	if err != nil {
		t.Fatal(err)
	}
	m, err := onnx.Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	return onnx.Import(m, onnx.Options{Inputs: feats([]int{g.features})})
}

// forward runs a model's graph on one sample.
func forward(t *testing.T, md *onnx.Model, x ...float32) []float32 {
	t.Helper()
	md.Graph.Init(1)
	be, _ := nn.NewBackend("ppnode-det", 1, true)
	out := md.Graph.Whole().Forward(&nn.Ctx{Backend: be}, 0, []*nn.Tensor{nn.FromData(slices.Clone(x), 1, len(x))})
	return nn.F32(out[0])
}

// A Cast of a constant converts it: x·Cast(2.5 → INT64) is x·2, not x·2.5.
func TestCastOfConstantConverts(t *testing.T) {
	g := &graph{features: 2}
	g.init("c", nil, 2.5)
	g.node("Cast", []string{"c"}, "ci", intAttr("to", int64(onnxpb.TensorProto_INT64)))
	g.node("Mul", []string{"x", "ci"}, "y")
	md, err := importGraph(t, g, "y")
	if err != nil {
		t.Fatal(err)
	}
	if got := forward(t, md, 1, 3); !slices.Equal(got, []float32{2, 6}) {
		t.Errorf("x·Cast(2.5 to int64) of [1 3] = %v, want [2 6]", got)
	}
}

// A Slice without ends is an error that names the node, not a panic.
func TestSliceWithoutEndsIsAnError(t *testing.T) {
	g := &graph{features: 4}
	g.ints("starts", []int64{1}, 1)
	g.node("Slice", []string{"x", "starts"}, "y")
	_, err := importGraph(t, g, "y")
	if !errors.Is(err, onnx.ErrModel) || !strings.Contains(err.Error(), "/y") || !strings.Contains(err.Error(), "ends") {
		t.Errorf("error %v, want onnx.ErrModel naming the node and its missing ends", err)
	}
}

// Trilu of a constant (torch.triu and torch.tril in forward, as
// nn.Transformer.generate_square_subsequent_mask) is folded, of floats and
// of integers, upper and lower, from any diagonal.
func TestTriluOfConstants(t *testing.T) {
	for _, c := range []struct {
		upper, diag int64 // diag < -9: no k input
		ints        bool
		want        []float32
	}{
		{1, -10, false, []float32{1, 2, 3, 4}},
		{1, 2, false, []float32{0, 0, 3, 4}},
		{0, 1, true, []float32{1, 2, 0, 0}},
		{0, -1, false, []float32{0, 0, 0, 0}},
	} {
		g := &graph{features: 4}
		g.ints("ones", []int64{1, 4}, 1, 1, 1, 1)
		tri, cast := []string{"ones"}, "ones"
		if !c.ints {
			g.node("Cast", []string{"ones"}, "onesf", intAttr("to", int64(onnxpb.TensorProto_FLOAT)))
			tri = []string{"onesf"}
		}
		if c.diag > -10 {
			g.ints("k", nil, c.diag)
			tri = append(tri, "k")
		}
		g.node("Trilu", tri, "mask", intAttr("upper", c.upper))
		if c.ints {
			g.node("Cast", []string{"mask"}, "maskf", intAttr("to", int64(onnxpb.TensorProto_FLOAT)))
			cast = "maskf"
		} else {
			cast = "mask"
		}
		g.node("Mul", []string{"x", cast}, "y")
		md, err := importGraph(t, g, "y")
		if err != nil {
			t.Fatal(err)
		}
		if got := forward(t, md, 1, 2, 3, 4); !slices.Equal(got, c.want) {
			t.Errorf("upper %d, k %d, integers %v: x·mask of [1 2 3 4] = %v, want %v", c.upper, c.diag, c.ints, got, c.want)
		}
	}
}

// A constant's NaN and infinities cast to integers become int64's
// smallest value, as PyTorch's do on x86, instead of a refusal (T5's
// position buckets take the log of 0 in a branch that Where discards);
// finite values truncate toward zero.
func TestCastOfNonFiniteConstants(t *testing.T) {
	g := &graph{features: 4}
	g.init("f", []int64{4}, float32(math.Inf(-1)), 2.7, float32(math.NaN()), -2.7)
	g.node("Cast", []string{"f"}, "i", intAttr("to", int64(onnxpb.TensorProto_INT64)))
	g.ints("bad", []int64{4}, 1, 0, 1, 0)
	g.node("Cast", []string{"bad"}, "isBad", intAttr("to", int64(onnxpb.TensorProto_BOOL)))
	g.ints("ones", []int64{4}, 1, 1, 1, 1)
	g.node("Where", []string{"isBad", "ones", "i"}, "kept")
	g.node("Cast", []string{"kept"}, "keptf", intAttr("to", int64(onnxpb.TensorProto_FLOAT)))
	g.node("Mul", []string{"x", "keptf"}, "y")
	md, err := importGraph(t, g, "y")
	if err != nil {
		t.Fatal(err)
	}
	if got := forward(t, md, 1, 2, 3, 4); !slices.Equal(got, []float32{1, 4, 3, -8}) {
		t.Errorf("x·where(bad, 1, int(f)) of [1 2 3 4] = %v, want [1 4 3 -8]", got)
	}
}

// A product of constants folds only as a zero state times a weight (a
// recurrent cell's first step); any other is refused, naming what folds.
func TestProductOfConstants(t *testing.T) {
	g := &graph{features: 4}
	g.init("w", []int64{4, 4}, make([]float32, 16)...)
	g.ints("c", []int64{1, 4}, 1, 2, 3, 4)
	g.node("Cast", []string{"c"}, "cf", intAttr("to", int64(onnxpb.TensorProto_FLOAT)))
	g.node("MatMul", []string{"cf", "w"}, "p")
	g.node("Add", []string{"x", "p"}, "y")
	if _, err := importGraph(t, g, "y"); !errors.Is(err, onnx.ErrModel) || !strings.Contains(err.Error(), "zero state") {
		t.Errorf("error %v, want onnx.ErrModel saying what folds", err)
	}
}

// torch.arange over the batch means nothing to layers that see
// micro-batches: anywhere but in a row index of a gather it is refused,
// with what it may serve for.
func TestBatchRangeRefused(t *testing.T) {
	g := &graph{features: 4}
	g.node("Shape", []string{"x"}, "shape")
	g.ints("zero", nil, 0)
	g.ints("one", nil, 1)
	g.ints("axes", []int64{1}, 1)
	g.node("Gather", []string{"shape", "zero"}, "n", intAttr("axis", 0))
	g.node("Range", []string{"zero", "n", "one"}, "r")
	g.node("Unsqueeze", []string{"r", "axes"}, "r1")
	g.node("Cast", []string{"r1"}, "rf", intAttr("to", int64(onnxpb.TensorProto_FLOAT)))
	g.node("Mul", []string{"x", "rf"}, "y")
	_, err := importGraph(t, g, "y")
	if !errors.Is(err, onnx.ErrModel) || !strings.Contains(err.Error(), "torch.arange(N), i]") || !strings.Contains(err.Error(), "Unsqueeze") {
		t.Errorf("error %v, want onnx.ErrModel saying where an index over the batch serves", err)
	}
}

// ScatterND of constants (a slice assignment, m[1:3] = 7, as PyTorch
// exports it) is folded, and indices out of range are an error, not a
// panic.
func TestScatterNDOfConstants(t *testing.T) {
	build := func(index int64) *graph {
		g := &graph{features: 4}
		g.ints("shape", []int64{1}, 4)
		g.node("ConstantOfShape", []string{"shape"}, "m")
		g.ints("idx", []int64{2, 1}, 1, index)
		g.ints("seven", []int64{2}, 7, 7)
		g.node("Cast", []string{"seven"}, "upd", intAttr("to", int64(onnxpb.TensorProto_FLOAT)))
		g.node("ScatterND", []string{"m", "idx", "upd"}, "mask")
		g.node("Mul", []string{"x", "mask"}, "y")
		return g
	}
	md, err := importGraph(t, build(2), "y")
	if err != nil {
		t.Fatal(err)
	}
	if got := forward(t, md, 1, 2, 3, 4); !slices.Equal(got, []float32{0, 14, 21, 0}) {
		t.Errorf("x·ScatterND([0 0 0 0], [[1] [2]], [7 7]) of [1 2 3 4] = %v, want [0 14 21 0]", got)
	}
	for _, bad := range []int64{4, -5} {
		if _, err := importGraph(t, build(bad), "y"); !errors.Is(err, onnx.ErrModel) || !strings.Contains(err.Error(), "index") {
			t.Errorf("index %d: error %v, want onnx.ErrModel naming the index", bad, err)
		}
	}
}

// Einsum of two operands becomes a product: of a value and a weight on
// either side ("ni,ij->nj", "ij,ni->nj") and of two values ("ni,ni->ni"),
// which the forward pass computes; other forms are refused by name.
func TestEinsum(t *testing.T) {
	eq := func(e string) *onnxpb.AttributeProto {
		return &onnxpb.AttributeProto{Name: proto.String("equation"), S: []byte(e), Type: onnxpb.AttributeProto_STRING.Enum()}
	}
	for _, c := range []struct {
		equation string
		ins      []string
		want     []float32
		err      string
	}{
		{"ni,ij->nj", []string{"x", "w"}, []float32{7, 10}, ""},
		{"ij,ni->nj", []string{"w", "x"}, []float32{7, 10}, ""},
		{"ni,ni->ni", []string{"x", "x"}, []float32{1, 4}, ""},
		{"ni->n", []string{"x"}, nil, "two operands"},
		{"nii,ni->ni", []string{"x", "x"}, nil, "operand"},
		{"ni,nj->nj", []string{"x", "x"}, nil, "a sum over one operand"},
	} {
		g := &graph{features: 2}
		g.init("w", []int64{2, 2}, 1, 2, 3, 4)
		g.node("Einsum", c.ins, "y", eq(c.equation))
		md, err := importGraph(t, g, "y")
		if c.err != "" {
			if !errors.Is(err, onnx.ErrModel) || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%s: error %v, want onnx.ErrModel saying %q", c.equation, err, c.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", c.equation, err)
			continue
		}
		if got := forward(t, md, 1, 2); !slices.Equal(got, c.want) {
			t.Errorf("%s of [1 2]: %v, want %v", c.equation, got, c.want)
		}
	}
}

// A recurrence whose initial state is a parameter (nn.Parameter h0) is
// refused: ppnode's LSTM and GRU start from zeros and would not train it.
func TestLearnedInitialStateIsRefused(t *testing.T) {
	m := read(t, "testdata/gru.onnx")
	for _, n := range m.GetGraph().GetNode() {
		if n.GetOpType() == "GRU" {
			n.Input[5] = "h0"
		}
	}
	m.Graph.Initializer = append(m.Graph.Initializer, &onnxpb.TensorProto{Name: proto.String("h0"), Dims: []int64{1, 1, 6},
		DataType: proto.Int32(int32(onnxpb.TensorProto_FLOAT)), FloatData: make([]float32, 6)})
	_, err := onnx.Import(m, onnx.Options{Inputs: models["testdata/gru.onnx"]})
	if !errors.Is(err, onnx.ErrModel) || !strings.Contains(err.Error(), "learned initial state") {
		t.Errorf("error %v, want onnx.ErrModel refusing the learned initial state", err)
	}
}

// A learnable scalar (nn.Parameter(torch.tensor(0.5))) is a trainable
// parameter of the model, named as in the state_dict, not a frozen constant.
func TestLearnableScalarIsTrained(t *testing.T) {
	g := &graph{features: 3}
	g.init("scale", nil, 0.5)
	g.node("Mul", []string{"x", "scale"}, "y")
	md, err := importGraph(t, g, "y")
	if err != nil {
		t.Fatal(err)
	}
	var found *nn.Param
	for _, p := range md.Graph.Params() {
		if p.Name == "scale" {
			found = p
		}
	}
	if found == nil || !found.Trainable() {
		t.Fatalf("parameters %v: want a trainable \"scale\"", names(md.Graph.Params()))
	}
	if got := forward(t, md, 2, 4, 6); !slices.Equal(got, []float32{1, 2, 3}) || nn.F32(found.Value)[0] != 0.5 {
		t.Errorf("x·scale of [2 4 6] = %v with scale %v", got, nn.F32(found.Value))
	}
}

func names(ps []*nn.Param) []string {
	var out []string
	for _, p := range ps {
		out = append(out, p.Name)
	}
	return out
}

// nn.Linear(bias=False) exports MatMul(x, Transpose(weight)): one Linear
// without bias, its weight the state_dict's [out, in].
func TestLinearWithoutBias(t *testing.T) {
	g := &graph{features: 2}
	g.init("fc.weight", []int64{3, 2}, 1, 2, 3, 4, 5, 6)
	g.node("Transpose", []string{"fc.weight"}, "wt", &onnxpb.AttributeProto{Name: proto.String("perm"), Ints: []int64{1, 0}, Type: onnxpb.AttributeProto_INTS.Enum()})
	g.node("MatMul", []string{"x", "wt"}, "y")
	md, err := importGraph(t, g, "y")
	if err != nil {
		t.Fatal(err)
	}
	ps := md.Graph.Params()
	if len(ps) != 1 || ps[0].Name != "fc.weight" || !slices.Equal(ps[0].ExportedShape(), []int{3, 2}) {
		t.Fatalf("parameters %v", names(ps))
	}
	if got := forward(t, md, 1, 1); !slices.Equal(got, []float32{3, 7, 11}) {
		t.Errorf("W·[1 1] = %v, want [3 7 11]", got)
	}
}

// A refusal names every unsupported operator of the model, once each.
func TestRefusalNamesEveryOperator(t *testing.T) {
	g := &graph{features: 2}
	g.node("Det", []string{"x"}, "a")
	g.node("Det", []string{"a"}, "b")
	g.node("NonMaxSuppression", []string{"b"}, "c")
	g.node("Relu", []string{"c"}, "y")
	_, err := importGraph(t, g, "y")
	if !errors.Is(err, onnx.ErrModel) {
		t.Fatalf("error %v, want onnx.ErrModel", err)
	}
	msg := err.Error()
	for _, want := range []string{`Det (nodes "/a" and 1 more)`, `NonMaxSuppression (node "/c")`} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q lacks %q", msg, want)
		}
	}
	if strings.Count(msg, "Det") != 1 {
		t.Errorf("error %q names Det more than once", msg)
	}
}

// README lists exactly the operators Supported returns.
func TestReadmeListsSupportedOperators(t *testing.T) {
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?s)<!-- operators -->(.*?)<!-- /operators -->`).FindSubmatch(b)
	if m == nil {
		t.Fatal("README has no <!-- operators --> list")
	}
	var listed []string
	for _, f := range regexp.MustCompile(`[A-Z][A-Za-z0-9]+`).FindAllString(string(m[1]), -1) {
		listed = append(listed, f)
	}
	slices.Sort(listed)
	if want := onnx.Supported(); !slices.Equal(listed, want) {
		t.Errorf("README lists %d operators %v;\nSupported has %d: %v", len(listed), listed, len(want), want)
	}
}

// Whatever a model holds, Import's errors wrap ErrModel (as the package
// doc says), and no panic is behind them: mutations of real models, node
// by node.
func TestEveryRefusalIsErrModel(t *testing.T) {
	for path, inputs := range models {
		t.Run(path, func(t *testing.T) { mutate(t, read(t, path), inputs) })
	}
}

func mutate(t *testing.T, base *onnxpb.ModelProto, inputs []onnx.Input) {
	mutations := []func(*onnxpb.NodeProto){
		func(n *onnxpb.NodeProto) { n.Input = nil },
		func(n *onnxpb.NodeProto) { n.Input = append(n.Input, "nowhere") },
		func(n *onnxpb.NodeProto) { n.Attribute = nil },
		func(n *onnxpb.NodeProto) {
			for _, a := range n.Attribute {
				a.I = proto.Int64(-7)
				for j := range a.Ints {
					a.Ints[j] = math.MaxInt64
				}
			}
		},
		func(n *onnxpb.NodeProto) { n.Input = []string{n.Input[0], n.Input[0], n.Input[0]} },
	}
	// The mutations change one node: Import reads the model, so each
	// mutated clone of the node takes the original's place for one import.
	count := 0
	for i, orig := range base.Graph.Node {
		for k, mut := range mutations {
			if len(orig.Input) == 0 && k == 4 {
				continue
			}
			n := proto.Clone(orig).(*onnxpb.NodeProto)
			mut(n)
			base.Graph.Node[i] = n
			_, err := onnx.Import(base, onnx.Options{Inputs: inputs})
			base.Graph.Node[i] = orig
			if err == nil {
				continue
			}
			count++
			if !errors.Is(err, onnx.ErrModel) || strings.Contains(err.Error(), "could not be imported") {
				t.Errorf("node %d mutation %d: %v (want onnx.ErrModel, and no panic recovered)", i, k, err)
			}
		}
	}
	if count < len(base.Graph.Node) {
		t.Errorf("only %d mutations were refused", count)
	}
}
