package actors

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/ppnode/ppnode/job"
	"github.com/ppnode/ppnode/tensorio"
)

// A node whose StageHost has a files directory sets up no stage of a job
// whose --init file is outside it: the spawn is refused naming the path.
func TestStageRefusesFilesOutsideItsDirectory(t *testing.T) {
	spec := smallSpec("mlp32")
	spec.Partition = "uniform"
	cs, err := job.Check(spec)
	if err != nil {
		t.Fatal(err)
	}
	j, err := cs.Prepare()
	if err != nil {
		t.Fatal(err)
	}
	es, err := job.WeightsEntries(j.Graph.Params(), 0, spec.MicroBatches)
	if err != nil {
		t.Fatal(err)
	}
	spec.Init = filepath.Join(t.TempDir(), "w.safetensors")
	if err := tensorio.SaveSafetensorsEntries(spec.Init, es, nil); err != nil {
		t.Fatal(err)
	}
	tc := newInmemCluster(t, 2, nil)
	files, err := job.OpenFiles(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer files.Close()
	tc.hosts[1].Files = files
	c, err := newCoordinator(spec, tc.config(2))
	if err != nil {
		t.Fatal(err)
	}
	res, err := c.Run(context.Background())
	t.Logf("result %+v, error %v", res, err)
	switch {
	case err != nil && (!strings.Contains(err.Error(), spec.Init) || !strings.Contains(err.Error(), "outside")):
		t.Fatalf("job failed with %v: want the refusal naming %s", err, spec.Init)
	case err == nil && slices.Contains(res.Nodes, "b"):
		t.Fatalf("node b ran a stage of a job reading %s outside its files directory: %+v", spec.Init, res.Nodes)
	}
}
