package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ppnode/ppnode/job"
	"github.com/ppnode/ppnode/tensorio"
)

func trainJSON(t *testing.T, args ...string) job.Result {
	t.Helper()
	var out, errb bytes.Buffer
	if code := run(append([]string{"train", "--local", "--json"}, args...), &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	var r job.Result
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &r); err != nil {
		t.Fatalf("last line is not JSON: %q", lines[len(lines)-1])
	}
	return r
}

// Two --deterministic runs give the same weights, whatever the thread count,
// and --out writes exactly those weights.
func TestDeterministicRuns(t *testing.T) {
	args := []string{"--deterministic", "--model", "vgg16", "--width", "0.125", "--data", "synthetic:16x16x3:10",
		"--synthetic-samples", "256", "--batch", "32", "--micro-batches", "4", "--steps", "4", "--lr", "0.01"}
	out := filepath.Join(t.TempDir(), "w.safetensors")
	a := trainJSON(t, append(args, "--threads", "1", "--out", out)...)
	b := trainJSON(t, append(args, "--threads", "2")...)
	if a.WeightsSHA256 != b.WeightsSHA256 || a.WeightsSHA256 == "" {
		t.Fatalf("deterministic runs differ: %s vs %s", a.WeightsSHA256, b.WeightsSHA256)
	}
	if a.Steps != 4 || a.Backend != "ppnode-det" || !a.Deterministic || a.Params == 0 {
		t.Fatalf("unexpected result %+v", a)
	}
	raw, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	es, meta, err := tensorio.ParseSafetensors(raw)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := tensorio.EntriesSHA256(es); got != a.WeightsSHA256 || meta["weights_sha256"] != a.WeightsSHA256 {
		t.Fatalf("saved weights hash to %s (metadata %s), run reported %s", got, meta["weights_sha256"], a.WeightsSHA256)
	}
	// PyTorch's names and layouts: conv3.weight OIHW, bn1's count of
	// training forward passes (4 steps of 4 micro-batches).
	for _, e := range es {
		switch e.Name {
		case "conv3.weight":
			if fmt.Sprint(e.Shape) != "[16 8 3 3]" {
				t.Errorf("conv3.weight has shape %v, want PyTorch's [16 8 3 3]", e.Shape)
			}
		case "bn1.num_batches_tracked":
			if n, err := e.Int64s(); err != nil || len(e.Shape) != 0 || n[0] != 16 {
				t.Errorf("bn1.num_batches_tracked: %v %v of shape %v, want 16 (a scalar)", n, err, e.Shape)
			}
		}
	}
}

func TestBadCommandLines(t *testing.T) {
	for _, c := range []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"nope"}, 2, "unknown command"},
		{[]string{"train", "--model", "mlp32"}, 2, "--local"},
		{[]string{"train", "--local", "--model", "resnet51"}, 2, "unknown model"},
		{[]string{"train", "--local", "--data", "cifar"}, 1, "unknown data set"},
		{[]string{"train", "--local", "--batch", "4", "--micro-batches", "8"}, 2, "micro-batches"},
		{[]string{"train", "--local", "--optimizer", "lbfgs", "--data", "synthetic:4x4x1", "--steps", "1"}, 2, "unknown optimizer"},
		{[]string{"train", "--local", "--lr", "-1", "--data", "synthetic:4x4x1", "--steps", "1"}, 2, "learning rate"},
		{[]string{"bench", "fft"}, 2, "usage"},
	} {
		var out, errb bytes.Buffer
		code := run(c.args, &out, &errb)
		if code != c.code || !strings.Contains(errb.String(), c.msg) {
			t.Errorf("%v: exit %d, stderr %q; want exit %d mentioning %q", c.args, code, errb.String(), c.code, c.msg)
		}
	}
}
