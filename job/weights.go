package job

import (
	"encoding/binary"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/ppnode/ppnode/nn"
	"github.com/ppnode/ppnode/tensorio"
)

// WeightsEntries are the tensors of a weights file, as the PyTorch
// state_dict of the same model holds them: every parameter and buffer by
// name in its exported layout (convolutions OIHW), and for each BatchNorm
// its num_batches_tracked, the training forward passes it saw (one per
// micro-batch of each of steps steps; none when microBatches is 0,
// unknown).
func WeightsEntries(ps []*nn.Param, steps, microBatches int) ([]tensorio.Entry, error) {
	var es []tensorio.Entry
	for _, p := range nn.SortByName(ps) {
		e, err := tensorio.F32Entry(p.Name, p.Exported())
		if err != nil {
			return nil, err
		}
		es = append(es, e)
		if prefix, ok := strings.CutSuffix(p.Name, ".running_mean"); ok && microBatches > 0 {
			b := make([]byte, 8)
			binary.LittleEndian.PutUint64(b, uint64(steps)*uint64(microBatches))
			es = append(es, tensorio.Entry{Name: prefix + ".num_batches_tracked", DType: tensorio.I64, Shape: []int{}, Data: b})
		}
	}
	return es, nil
}

// LayoutMetaPrefix starts the checkpoint metadata key that records a
// parameter's exported layout (nn.Param.Layout), so that a cut exports
// without the model.
const LayoutMetaPrefix = "layout."

// FormatLayout writes a layout as checkpoint metadata: "0,3,1,2".
func FormatLayout(l []int) string {
	s := make([]string, len(l))
	for i, a := range l {
		s[i] = strconv.Itoa(a)
	}
	return strings.Join(s, ",")
}

// ParseLayout reads FormatLayout's text for a tensor of rank dimensions,
// checking that it is a permutation.
func ParseLayout(text string, rank int) ([]int, error) {
	parts := strings.Split(text, ",")
	l := make([]int, len(parts))
	for i, p := range parts {
		a, err := strconv.Atoi(p)
		if err != nil || a < 0 || a >= rank {
			return nil, fmt.Errorf("layout %q of a %d-dimensional tensor", text, rank)
		}
		l[i] = a
	}
	if len(l) != rank || len(slices.Compact(slices.Sorted(slices.Values(l)))) != rank {
		return nil, fmt.Errorf("layout %q of a %d-dimensional tensor", text, rank)
	}
	return l, nil
}
