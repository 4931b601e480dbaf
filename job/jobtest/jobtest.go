// Package jobtest helps the tests of the packages that run jobs: the
// single-process result a pipelined run must reproduce.
package jobtest

import (
	"testing"

	"github.com/ppnode/ppnode/job"
)

// SmallSpec is a deterministic job of a few steps of a narrow mlp32 on
// synthetic data, one thread: seconds to train anywhere.
func SmallSpec() job.Spec {
	s := job.DefaultSpec()
	s.Model, s.Data, s.SyntheticSamples, s.Width = "mlp32", "synthetic:8x8x1:4", 96, 16
	s.Batch, s.MicroBatches, s.Epochs, s.Steps = 24, 4, 1, 3
	s.Deterministic, s.Threads = true, 1
	return s
}

// LocalSHA is the weights_sha256 of spec trained in this process, with one
// thread (`ppnode train --local`).
func LocalSHA(t testing.TB, spec job.Spec) string {
	t.Helper()
	return Local(t, spec).WeightsSHA256
}

// Local is the result of spec trained in this process, with one thread.
func Local(t testing.TB, spec job.Spec) *job.Result {
	t.Helper()
	j, err := Check(t, spec).Prepare()
	if err != nil {
		t.Fatal(err)
	}
	res, err := j.TrainLocal(1, job.LocalHooks{})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// Check is job.Check of a spec the test knows is good.
func Check(t testing.TB, spec job.Spec) job.Checked {
	t.Helper()
	c, err := job.Check(spec)
	if err != nil {
		t.Fatal(err)
	}
	return c
}
