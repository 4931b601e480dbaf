package onnx

import (
	"google.golang.org/protobuf/proto"

	"github.com/ppnode/ppnode/onnx/onnxpb"
)

// fuse replaces the operator patterns that PyTorch's exporter writes for
// one module by one node that one layer computes:
//
//   - LayerNorm at opset 13: ReduceMean, Sub, Pow 2, ReduceMean, Add ε,
//     Sqrt, Div, then Mul by the weight and Add of the bias, becomes
//     ppnode.LayerNorm(x, weight, bias, ε, exponent);
//   - GELU's erf form (nn.GELU at opset 13): Div by √2, Erf, Add 1, Mul by
//     the input, Mul by 0.5, becomes ppnode.Gelu(x, √2, 1, 0.5);
//   - a Linear on more than two dimensions: MatMul by the transposed weight
//     then Add of the bias becomes ppnode.Linear(x, weightᵀ, bias);
//   - hardswish at opset 13: HardSigmoid (alpha 1/6, beta 1/2) then Mul by
//     the input becomes ppnode.HardSwish(x).
//
// The fused node keeps the nodes it stands for, which its handler runs
// instead where the constants turn out not to fit (an exponent that is
// not 2). Only tensors that nothing else reads are fused away.
func fuse(nodes []*onnxpb.NodeProto, graphOutputs []string, im *importer) []*onnxpb.NodeProto {
	producer := map[string]int{}
	readers := map[string][]int{}
	for i, n := range nodes {
		for _, o := range n.GetOutput() {
			producer[o] = i
		}
		for _, in := range n.GetInput() {
			readers[in] = append(readers[in], i)
		}
	}
	outputs := map[string]bool{}
	for _, o := range graphOutputs {
		outputs[o] = true
	}
	// A tensor read by exactly one node, which is of type op: that node.
	only := func(t, op string) (int, bool) {
		r := readers[t]
		if len(r) != 1 || outputs[t] || nodes[r[0]].GetOpType() != op {
			return 0, false
		}
		return r[0], true
	}
	gone := map[int]bool{}
	replace := map[int]*onnxpb.NodeProto{} // at the pattern's last node
	im.unfused = map[*onnxpb.NodeProto][]*onnxpb.NodeProto{}
	for i, n := range nodes {
		if gone[i] {
			continue
		}
		switch n.GetOpType() {
		case "ReduceMean":
			if ps, f := layerNormAt(nodes, i, only, readers); f != nil {
				for _, p := range ps[:len(ps)-1] {
					gone[p] = true
				}
				replace[ps[len(ps)-1]] = f
				var orig []*onnxpb.NodeProto
				for _, p := range ps {
					orig = append(orig, nodes[p])
				}
				im.unfused[f] = orig
			}
		case "Div":
			if ps, f := geluAt(nodes, i, only); f != nil {
				for _, p := range ps[:len(ps)-1] {
					gone[p] = true
				}
				replace[ps[len(ps)-1]] = f
				var orig []*onnxpb.NodeProto
				for _, p := range ps {
					orig = append(orig, nodes[p])
				}
				im.unfused[f] = orig
			}
		case "HardSigmoid":
			x := n.GetInput()[0]
			mul, ok := only(n.GetOutput()[0], "Mul")
			if !ok || gone[mul] || len(nodes[mul].GetInput()) != 2 || other(nodes[mul], n.GetOutput()[0]) != x ||
				attrFloat(n, "alpha", 0.2) != float32(1.0/6) || attrFloat(n, "beta", 0.5) != 0.5 {
				continue
			}
			f := &onnxpb.NodeProto{OpType: proto.String("ppnode.HardSwish"), Name: n.Name, Input: []string{x}, Output: []string{nodes[mul].GetOutput()[0]}}
			gone[i] = true
			replace[mul] = f
			im.unfused[f] = []*onnxpb.NodeProto{n, nodes[mul]}
		case "MatMul":
			add, ok := only(n.GetOutput()[0], "Add")
			if !ok || gone[add] {
				continue
			}
			a := nodes[add]
			bias := a.GetInput()[0]
			if bias == n.GetOutput()[0] {
				bias = a.GetInput()[1]
			}
			if _, isInit := im.initID[bias]; !isInit || len(n.GetInput()) != 2 {
				continue
			}
			f := &onnxpb.NodeProto{
				OpType: proto.String("ppnode.Linear"), Name: n.Name,
				Input:  []string{n.GetInput()[0], n.GetInput()[1], bias},
				Output: []string{a.GetOutput()[0]},
			}
			gone[i] = true
			replace[add] = f
			im.unfused[f] = []*onnxpb.NodeProto{n, a}
		}
	}
	var out []*onnxpb.NodeProto
	for i, n := range nodes {
		switch {
		case replace[i] != nil:
			out = append(out, replace[i])
		case !gone[i]:
			out = append(out, n)
		}
	}
	return out
}

// layerNormAt matches the decomposed LayerNorm starting at the ReduceMean
// nodes[i]; it returns the pattern's nodes (the last one's output is the
// fused node's) and the fused node.
func layerNormAt(nodes []*onnxpb.NodeProto, i int, only func(string, string) (int, bool), readers map[string][]int) ([]int, *onnxpb.NodeProto) {
	mean := nodes[i]
	if !lastAxis(mean) || len(mean.GetInput()) < 1 {
		return nil, nil
	}
	x := mean.GetInput()[0]
	sub, ok := only(mean.GetOutput()[0], "Sub")
	if !ok || nodes[sub].GetInput()[0] != x || nodes[sub].GetInput()[1] != mean.GetOutput()[0] {
		return nil, nil
	}
	d := nodes[sub].GetOutput()[0]
	r := readers[d]
	if len(r) != 2 {
		return nil, nil
	}
	pow, div := r[0], r[1]
	if nodes[pow].GetOpType() != "Pow" {
		pow, div = div, pow
	}
	if nodes[pow].GetOpType() != "Pow" || nodes[div].GetOpType() != "Div" || nodes[pow].GetInput()[0] != d || nodes[div].GetInput()[0] != d {
		return nil, nil
	}
	mean2, ok := only(nodes[pow].GetOutput()[0], "ReduceMean")
	if !ok || !lastAxis(nodes[mean2]) {
		return nil, nil
	}
	addEps, ok := only(nodes[mean2].GetOutput()[0], "Add")
	if !ok || nodes[addEps].GetInput()[0] != nodes[mean2].GetOutput()[0] {
		return nil, nil
	}
	sqrt, ok := only(nodes[addEps].GetOutput()[0], "Sqrt")
	if !ok {
		return nil, nil
	}
	if d2, ok := only(nodes[sqrt].GetOutput()[0], "Div"); !ok || d2 != div || nodes[div].GetInput()[1] != nodes[sqrt].GetOutput()[0] {
		return nil, nil
	}
	ps := []int{i, sub, pow, mean2, addEps, sqrt, div}
	inputs := []string{x, "", "", nodes[addEps].GetInput()[1], nodes[pow].GetInput()[1]}
	last := div
	if mul, ok := only(nodes[div].GetOutput()[0], "Mul"); ok && nodes[mul].GetInput()[0] == nodes[div].GetOutput()[0] {
		inputs[1] = nodes[mul].GetInput()[1]
		ps, last = append(ps, mul), mul
		if add, ok := only(nodes[mul].GetOutput()[0], "Add"); ok && nodes[add].GetInput()[0] == nodes[mul].GetOutput()[0] {
			inputs[2] = nodes[add].GetInput()[1]
			ps, last = append(ps, add), add
		}
	}
	f := &onnxpb.NodeProto{
		OpType: proto.String("ppnode.LayerNorm"), Name: mean.Name,
		Input: inputs, Output: []string{nodes[last].GetOutput()[0]},
	}
	return ps, f
}

// lastAxis reports whether a ReduceMean reduces the last axis alone,
// keeping it (its axes as an attribute: opsets before 18).
func lastAxis(n *onnxpb.NodeProto) bool {
	axes, ok := attrInts(n, "axes")
	return ok && len(axes) == 1 && axes[0] == -1 && attrInt(n, "keepdims", 1) == 1 && len(n.GetInput()) == 1
}

// geluAt matches GELU's erf form starting at the Div nodes[i].
func geluAt(nodes []*onnxpb.NodeProto, i int, only func(string, string) (int, bool)) ([]int, *onnxpb.NodeProto) {
	div := nodes[i]
	if len(div.GetInput()) != 2 {
		return nil, nil
	}
	x := div.GetInput()[0]
	erf, ok := only(div.GetOutput()[0], "Erf")
	if !ok {
		return nil, nil
	}
	add, ok := only(nodes[erf].GetOutput()[0], "Add")
	if !ok || len(nodes[add].GetInput()) != 2 {
		return nil, nil
	}
	one := other(nodes[add], nodes[erf].GetOutput()[0])
	mul, ok := only(nodes[add].GetOutput()[0], "Mul")
	if !ok || len(nodes[mul].GetInput()) != 2 || other(nodes[mul], nodes[add].GetOutput()[0]) != x {
		return nil, nil
	}
	half, ok := only(nodes[mul].GetOutput()[0], "Mul")
	if !ok || len(nodes[half].GetInput()) != 2 {
		return nil, nil
	}
	f := &onnxpb.NodeProto{
		OpType: proto.String("ppnode.Gelu"), Name: div.Name,
		Input:  []string{x, div.GetInput()[1], one, other(nodes[half], nodes[mul].GetOutput()[0])},
		Output: []string{nodes[half].GetOutput()[0]},
	}
	return []int{i, erf, add, mul, half}, f
}

// other is the input of a two-input node that is not t ("" if both are).
func other(n *onnxpb.NodeProto, t string) string {
	in := n.GetInput()
	switch {
	case in[0] == t && in[1] != t:
		return in[1]
	case in[1] == t && in[0] != t:
		return in[0]
	}
	return ""
}
