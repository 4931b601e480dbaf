package main

import (
	"github.com/ppnode/ppnode/job"
	"github.com/ppnode/ppnode/nn"
	"github.com/ppnode/ppnode/tensorio"
)

// saveWeights writes every parameter and buffer by name as safetensors,
// with job.WeightsMeta.
func saveWeights(path string, params []*nn.Param, res job.Result) error {
	ts := make([]tensorio.Named, 0, len(params))
	for _, p := range nn.SortByName(params) {
		ts = append(ts, tensorio.Named{Name: p.Name, T: p.Value})
	}
	return tensorio.SaveSafetensors(path, ts, job.WeightsMeta(res))
}
