package main

import (
	"github.com/ppnode/ppnode/job"
	"github.com/ppnode/ppnode/nn"
	"github.com/ppnode/ppnode/tensorio"
)

// saveWeights writes the job's parameters and buffers by name as
// safetensors, with its metadata (job.Job.WeightsMeta).
func saveWeights(path string, jb *job.Job, res job.Result) error {
	params := jb.Graph.Params()
	ts := make([]tensorio.Named, 0, len(params))
	for _, p := range nn.SortByName(params) {
		ts = append(ts, tensorio.Named{Name: p.Name, T: p.Value})
	}
	return tensorio.SaveSafetensors(path, ts, jb.WeightsMeta(res))
}
