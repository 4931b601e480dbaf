package main

import (
	"bytes"
	"encoding/json"
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
	if a.Steps != 4 || a.Backend != "gonum" || !a.Deterministic || a.Params == 0 {
		t.Fatalf("unexpected result %+v", a)
	}
	ts, meta, err := tensorio.LoadSafetensors(out)
	if err != nil {
		t.Fatal(err)
	}
	if got := tensorio.WeightsSHA256(ts); got != a.WeightsSHA256 || meta["weights_sha256"] != a.WeightsSHA256 {
		t.Fatalf("saved weights hash to %s (metadata %s), run reported %s", got, meta["weights_sha256"], a.WeightsSHA256)
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
