package main

import (
	"fmt"

	"github.com/ppnode/ppnode/job"
	"github.com/ppnode/ppnode/nn"
	"github.com/ppnode/ppnode/tensorio"
)

// saveWeights writes every parameter and buffer by name as safetensors.
// Tensors keep ppnode's layout, recorded in the metadata: Linear weights are
// [out, in] as in PyTorch; Conv2D weights are [out, kh, kw, in] (PyTorch's
// is [out, in, kh, kw]: permute(0, 3, 1, 2)).
func saveWeights(path string, params []*nn.Param, res job.Result) error {
	ts := make([]tensorio.Named, 0, len(params))
	for _, p := range nn.SortByName(params) {
		ts = append(ts, tensorio.Named{Name: p.Name, T: p.Value})
	}
	meta := map[string]string{
		"format":         "ppnode",
		"model":          res.Model,
		"steps":          fmt.Sprint(res.Steps),
		"layout":         "activations NHWC; conv2d weights OHWI; linear weights [out, in]",
		"weights_sha256": res.WeightsSHA256,
	}
	return tensorio.SaveSafetensors(path, ts, meta)
}
