package onnx

import (
	"fmt"
	"slices"

	"github.com/ppnode/ppnode/nn"
	"github.com/ppnode/ppnode/onnx/onnxpb"
)

// One row of each sample, chosen by an index computed from the data:
// x[torch.arange(N), i], as a classifier pools at each sequence's last
// token (Hugging Face's GPT2ForSequenceClassification, CLIP's text
// encoder). PyTorch exports it as Range(0, N) · T + i, a Gather from x
// viewed as [N·T, ...]. Range over the batch has no meaning of its own in
// ppnode, whose layers see micro-batches: it is followed through that
// arithmetic and becomes one nn.Pick, or is refused.

// batchRows is n·scale + plus[n] for each sample n (plus, if set, a
// per-sample integer value).
type batchRows struct {
	scale int64
	plus  *value
}

// batchRange reports whether Range's inputs are 0, the batch size and 1.
func (im *importer) batchRange() bool {
	var vs [3]sym
	for i := range vs {
		k, ok := im.konst(i)
		if !ok || k.size() != 1 || k.kind == kFloat {
			return false
		}
		vs[i] = k.i[0]
	}
	return vs[0] == sym{} && vs[1] == sym{c: 1, n: true} && vs[2] == sym{c: 1}
}

// runRows adds node n, one of whose inputs is a batchRows.
func (im *importer) runRows(n *onnxpb.NodeProto) error {
	const use = "the index of each sample in the batch (torch.arange over the batch) serves only as the row of a gather, x[torch.arange(N), i]"
	ins := n.GetInput()
	r, at := im.perRow[ins[0]], 0
	if r == nil && len(ins) > 1 {
		r, at = im.perRow[ins[1]], 1
	}
	out := n.GetOutput()[0]
	switch op := n.GetOpType(); {
	case op == "Cast" || op == "Identity":
		im.perRow[out] = r
	case op == "Shape":
		im.setK(0, newSyms([]int{1}, []sym{{c: 1, n: true}}))
	case op == "Mul" && len(ins) == 2 && r.plus == nil:
		k, ok := im.konst(1 - at)
		var c []int64
		if ok {
			c, ok = k.ints()
		}
		if !ok || len(c) != 1 {
			return fmt.Errorf("%s: a product with other than one integer", use)
		}
		im.freeze(k)
		im.perRow[out] = &batchRows{scale: r.scale * c[0]}
	case op == "Add" && len(ins) == 2 && r.plus == nil:
		v, err := im.val(1 - at)
		if err != nil || !v.isInt || v.rank() != 1 {
			return fmt.Errorf("%s: added to other than one integer computed from each sample's data", use)
		}
		im.perRow[out] = &batchRows{scale: r.scale, plus: v}
	case op == "Gather" && at == 1:
		v, err := im.val(0)
		if err != nil {
			return err
		}
		return im.pick(n, v, r)
	default:
		return fmt.Errorf("%s (here %s)", use, op)
	}
	return nil
}

// pick adds the Gather of one row of each sample from v, viewed as [N·T,
// ...], at rows r.
func (im *importer) pick(n *onnxpb.NodeProto, v *value, r *batchRows) error {
	merged := v.dims[0]
	if attrInt(n, "axis", 0) != 0 || r.plus == nil || len(merged) != 2 || merged[0] != 0 || int64(v.axisSize(merged[1])) != r.scale {
		return fmt.Errorf("x[torch.arange(N), i] needs x viewed as [N·%d, ...] and the gather along it, not %v", r.scale, v)
	}
	split := &value{name: v.name, stored: v.stored, dims: append([][]int{{0}, {merged[1]}}, v.dims[1:]...), isInt: v.isInt}
	split, err := im.rowMajor(split)
	if err != nil {
		return err
	}
	name := im.add("", &nn.Pick{}, split, r.plus)
	dims := [][]int{{0}}
	for _, as := range split.dims[2:] {
		shifted := slices.Clone(as)
		for j := range shifted {
			shifted[j]--
		}
		dims = append(dims, shifted)
	}
	im.set(0, im.newValue(name, dims, v.isInt))
	return nil
}

// argMax adds ArgMax of a value along one axis (of token ids, or of
// scores): integers, without gradient.
func argMax(im *importer, n *onnxpb.NodeProto) error {
	v, err := im.val(0)
	if err != nil {
		return err
	}
	if attrInt(n, "select_last_index", 0) != 0 {
		return fmt.Errorf("select_last_index is not supported")
	}
	d, err := normAxis(attrInt(n, "axis", 0), v.rank())
	if err != nil {
		return err
	}
	if v, err = im.lastDims(v, d); err != nil {
		return err
	}
	name := im.add("", &nn.Reduce{Op: "argmax"}, v)
	dims := make([][]int, 0, v.rank())
	for e, as := range v.dims {
		switch {
		case e != d:
			dims = append(dims, as)
		case attrInt(n, "keepdims", 1) != 0:
			dims = append(dims, []int{})
		}
	}
	im.set(0, im.newValue(name, dims, true))
	return nil
}
