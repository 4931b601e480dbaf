package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/ppnode/ppnode/nn"
	"github.com/ppnode/ppnode/tensorio"
)

// A user's data set in a NumPy file: written with numpy.savez,
// trained on in one process and through a cluster, with the same weights;
// the cluster's weights come out with train --via --out.
func TestDataFile(t *testing.T) {
	t.Parallel()
	if _, err := exec.Command("/usr/bin/python3", "-c", "import numpy").CombinedOutput(); err != nil {
		t.Skip("no numpy for /usr/bin/python3 (Debian's python3-numpy)")
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "digits.npz")
	// The same arrays as .npz and as .safetensors, both written by NumPy.
	script := `import json, struct, sys, numpy as np
rng = np.random.default_rng(1)
x = rng.integers(0, 256, (640, 8, 8, 1), dtype=np.uint8)
y = (x[:, 0, 0, 0] % 4).astype(np.int64)
np.savez_compressed(sys.argv[1] + ".npz", x=x, y=y)
header, body = {}, b""
for name, a, dt in (("x", x, "U8"), ("y", y, "I64")):
    header[name] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [len(body), len(body) + a.nbytes]}
    body += a.tobytes()
h = json.dumps(header).encode()
open(sys.argv[1] + ".safetensors", "wb").write(struct.pack("<Q", len(h)) + h + body)`
	if out, err := exec.Command("/usr/bin/python3", "-c", script, filepath.Join(dir, "digits")).CombinedOutput(); err != nil {
		t.Fatalf("numpy: %v\n%s", err, out)
	}
	args := []string{"--deterministic", "--model", "mlp32", "--width", "32", "--data", path,
		"--batch", "32", "--micro-batches", "4", "--steps", "8", "--threads", "1"}
	local, err := Train(t, time.Minute, append([]string{"--local"}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	st, err := Train(t, time.Minute, append([]string{"--local"}, append(args, "--data", filepath.Join(dir, "digits.safetensors"))...)...)
	if err != nil {
		t.Fatal(err)
	}
	if st.WeightsSHA256 != local.WeightsSHA256 {
		t.Errorf("the arrays as .safetensors: weights %s; as .npz %s", st.WeightsSHA256, local.WeightsSHA256)
	}
	c := StartCluster(t, NodeOptions{Threads: 1}, NodeOptions{Threads: 1})
	waitMembers(t, c.Node("a"), 2)
	out := filepath.Join(t.TempDir(), "w.safetensors")
	via, err := Train(t, time.Minute, append([]string{"--via", c.Node("a").HTTP, "--partition", "uniform", "--out", out}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	if via.WeightsSHA256 != local.WeightsSHA256 {
		t.Errorf("two nodes: weights %s, --local %s", via.WeightsSHA256, local.WeightsSHA256)
	}
	// The weights out of the distributed run (train --via --out) are --local's.
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	es, meta, err := tensorio.ParseSafetensors(b)
	if err != nil {
		t.Fatal(err)
	}
	names, ts := make([]string, len(es)), make([]*nn.Tensor, len(es))
	for i, e := range es {
		names[i] = e.Name
		if ts[i], err = e.Tensor(); err != nil {
			t.Fatal(err)
		}
	}
	if got := nn.TensorsSHA256(names, ts); got != local.WeightsSHA256 || meta["weights_sha256"] != got {
		t.Errorf("--out file: weights %s (metadata %s), --local %s", got, meta["weights_sha256"], local.WeightsSHA256)
	}
	if meta["model"] != "mlp32" || meta["width"] != "32" || meta["input_shape"] != "[8,8,1]" || meta["classes"] != "4" || meta["input_mean"] == "" || meta["input_std"] == "" {
		t.Errorf("--out file's metadata %v: want the model, width, input shape, classes and standardisation", meta)
	}
	t.Logf("%s: test accuracy %.3f; weights %.16s on one process and two nodes", filepath.Base(path), local.TestAccuracy, local.WeightsSHA256)
}
