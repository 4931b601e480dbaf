package main

import (
	"github.com/ppnode/ppnode/job"
	"github.com/ppnode/ppnode/tensorio"
)

// saveWeights writes the job's parameters and buffers as the PyTorch
// state_dict of the model holds them (job.WeightsEntries), with the job's
// metadata (job.Job.WeightsMeta), atomically.
func saveWeights(path string, jb *job.Job, res job.Result) error {
	es, err := job.WeightsEntries(jb.Graph.Params(), res.Steps, jb.Spec.MicroBatches)
	if err != nil {
		return err
	}
	return tensorio.SaveSafetensorsEntries(path, es, jb.WeightsMeta(res))
}
