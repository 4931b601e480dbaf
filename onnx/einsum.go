package onnx

import (
	"fmt"
	"slices"
	"strings"

	"google.golang.org/protobuf/proto"

	"github.com/ppnode/ppnode/onnx/onnxpb"
)

// einsum adds an Einsum of two operands that is a product: each index is
// in both operands and the output (a batch index), in both operands only
// (summed), or in one operand and the output. It becomes the nodes PyTorch
// would write for it by hand, run in turn: each operand transposed to
// [batch, its own, summed] (the second [batch, summed, its own]) and
// reshaped to three axes (two without batch indices), a MatMul, a reshape
// to the indices' sizes and a transpose to the output's order.
func einsum(im *importer, n *onnxpb.NodeProto) error {
	eq := strings.ReplaceAll(attrString(n, "equation", ""), " ", "")
	lhs, out, ok := strings.Cut(eq, "->")
	ins := strings.Split(lhs, ",")
	if !ok || len(ins) != 2 || len(n.GetInput()) != 2 {
		return fmt.Errorf("equation %q: two operands and an explicit output (->) only", eq)
	}
	// The operands' shapes, values' or constants'.
	var shapes [2][]sym
	for i := range 2 {
		if v, err := im.val(i); err == nil {
			shapes[i] = v.shape()
		} else if k, ok := im.konst(i); ok {
			shapes[i] = konstShape(k)
		} else {
			return err
		}
	}
	orig := im.node
	defer func() { im.node = orig }()
	if _, err := im.val(0); err != nil { // MatMul takes a constant second
		ins[0], ins[1] = ins[1], ins[0]
		shapes[0], shapes[1] = shapes[1], shapes[0]
		n = &onnxpb.NodeProto{Name: n.Name, OpType: n.OpType, Input: []string{n.GetInput()[1], n.GetInput()[0]}, Output: n.Output}
	}
	size := map[rune]sym{}
	for i, s := range ins {
		if strings.Contains(s, ".") || len(s) != len(shapes[i]) {
			return fmt.Errorf("operand %q of shape %v (no ellipsis)", s, shapes[i])
		}
		for j, c := range s {
			if strings.Count(s, string(c)) > 1 {
				return fmt.Errorf("index %c twice in %q (a diagonal)", c, s)
			}
			if d, ok := size[c]; ok && d != shapes[i][j] {
				return fmt.Errorf("index %c of sizes %v and %v", c, d, shapes[i][j])
			}
			size[c] = shapes[i][j]
		}
	}
	var b, sum []rune // in both operands and the output; in both only
	var own [2][]rune // operand i's indices in the output alone
	for _, c := range out {
		inA, inB := strings.ContainsRune(ins[0], c), strings.ContainsRune(ins[1], c)
		switch {
		case strings.Count(out, string(c)) > 1 || !inA && !inB:
			return fmt.Errorf("output index %c", c)
		case inA && inB:
			b = append(b, c)
		case inA:
			own[0] = append(own[0], c)
		default:
			own[1] = append(own[1], c)
		}
	}
	for _, c := range ins[0] {
		if strings.ContainsRune(ins[1], c) && !strings.ContainsRune(out, c) {
			sum = append(sum, c)
		}
	}
	for i, s := range ins {
		for _, c := range s {
			if !strings.ContainsRune(out, c) && !strings.ContainsRune(ins[1-i], c) {
				return fmt.Errorf("index %c of %q only (a sum over one operand)", c, s)
			}
		}
	}
	prodOf := func(cs []rune) sym {
		p := sym{c: 1}
		for _, c := range cs {
			d := size[c]
			if d.n && p.n {
				return sym{c: -1} // refused below
			}
			p = sym{c: p.c * d.c, n: p.n || d.n}
		}
		return p
	}
	groups := [2][][]rune{{b, own[0], sum}, {b, sum, own[1]}}
	name := func(s string) string { return n.GetOutput()[0] + "#einsum." + s }
	var nodes []*onnxpb.NodeProto
	add := func(op string, ins []string, out string, attrs ...*onnxpb.AttributeProto) {
		nodes = append(nodes, &onnxpb.NodeProto{OpType: proto.String(op), Name: n.Name, Input: ins, Output: []string{out}, Attribute: attrs})
	}
	shapeK := func(key string, dims []sym) string {
		for _, d := range dims {
			if d.c < 0 {
				return ""
			}
		}
		im.consts[name(key)] = newSyms([]int{len(dims)}, dims)
		return name(key)
	}
	var flat [2]string
	for i := range 2 {
		order := slices.Concat(groups[i]...)
		perm := make([]int64, len(order))
		for j, c := range order {
			perm[j] = int64(strings.IndexRune(ins[i], c))
		}
		dims := []sym{prodOf(groups[i][0]), prodOf(groups[i][1]), prodOf(groups[i][2])}
		if len(b) == 0 { // two axes: [own, summed] and [summed, own]
			dims = dims[1:]
		}
		k := shapeK(fmt.Sprint("shape", i), dims)
		if k == "" {
			return fmt.Errorf("equation %q merges the batch with another axis of the batch's size", eq)
		}
		add("Transpose", []string{n.GetInput()[i]}, name(fmt.Sprint("t", i)), &onnxpb.AttributeProto{Name: proto.String("perm"), Ints: perm, Type: onnxpb.AttributeProto_INTS.Enum()})
		add("Reshape", []string{name(fmt.Sprint("t", i)), k}, name(fmt.Sprint("r", i)))
		flat[i] = name(fmt.Sprint("r", i))
	}
	add("MatMul", flat[:], name("product"))
	var dims []sym
	prodOrder := slices.Concat(b, own[0], own[1])
	for _, c := range prodOrder {
		dims = append(dims, size[c])
	}
	k := shapeK("shape", dims)
	add("Reshape", []string{name("product"), k}, name("unflat"))
	perm := make([]int64, len(out))
	for j, c := range out {
		perm[j] = int64(slices.Index(prodOrder, c))
	}
	add("Transpose", []string{name("unflat")}, n.GetOutput()[0], &onnxpb.AttributeProto{Name: proto.String("perm"), Ints: perm, Type: onnxpb.AttributeProto_INTS.Enum()})
	for _, o := range nodes {
		im.node = o
		if err := im.run(o); err != nil {
			return fmt.Errorf("as %s: %w", o.GetOpType(), err)
		}
	}
	return nil
}
