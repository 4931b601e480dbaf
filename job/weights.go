package job

import (
	"encoding/binary"
	"strings"

	"github.com/ppnode/ppnode/nn"
	"github.com/ppnode/ppnode/tensorio"
)

// WeightsEntries are the tensors of a weights file, as the PyTorch
// state_dict of the same model holds them: every parameter and buffer by
// name in its exported layout (convolutions OIHW; a tied tensor under each
// of its names, Param.Aliases), and for each BatchNorm
// its num_batches_tracked, the training forward passes it saw (one per
// micro-batch of each of steps steps; none when microBatches is 0,
// unknown).
func WeightsEntries(ps []*nn.Param, steps, microBatches int) ([]tensorio.Entry, error) {
	var es []tensorio.Entry
	for _, p := range nn.SortByName(nn.Unique(ps)) {
		for _, name := range append([]string{p.Name}, p.Aliases...) {
			e, err := tensorio.F32Entry(name, p.Exported())
			if err != nil {
				return nil, err
			}
			es = append(es, e)
		}
		if prefix, ok := strings.CutSuffix(p.Name, ".running_mean"); ok && microBatches > 0 {
			b := make([]byte, 8)
			binary.LittleEndian.PutUint64(b, uint64(steps)*uint64(microBatches))
			es = append(es, tensorio.Entry{Name: prefix + ".num_batches_tracked", DType: tensorio.I64, Shape: []int{}, Data: b})
		}
	}
	return es, nil
}
