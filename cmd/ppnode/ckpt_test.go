package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ppnode/ppnode/nn"
	"github.com/ppnode/ppnode/tensorio"
)

func runCmd(args ...string) (code int, stdout, stderr string) {
	var out, errb bytes.Buffer
	code = run(args, &out, &errb)
	return code, out.String(), errb.String()
}

func testCheckpoint(t *testing.T) (string, *tensorio.Checkpoint) {
	t.Helper()
	w := nn.FromData([]float32{1, -2, 3, 0, 5, 6}, 2, 3)
	b := nn.FromData([]float32{0.5, -0.25}, 2)
	c := &tensorio.Checkpoint{
		JobID: "job-1", Step: 42, PlanHash: "p0", Data: tensorio.DataPos{Epoch: 1, Step: 7},
		RNG: []byte{1, 2, 3}, Meta: map[string]string{"model": "mlp32"},
		Params: []tensorio.Named{{Name: "fc1.bias", T: b}, {Name: "fc1.weight", T: w}},
		Optim:  []tensorio.OptimState{{Param: "fc1.weight", Slot: "m", T: nn.FromData([]float32{1, 1, 1, 1, 1, 1}, 2, 3)}},
	}
	path := filepath.Join(t.TempDir(), "step-42.ckpt")
	if err := tensorio.SaveCheckpoint(path, c); err != nil {
		t.Fatal(err)
	}
	return path, c
}

func crcOf(t *nn.Tensor) string {
	e, _ := tensorio.F32Entry("", t)
	return fmt.Sprintf("%08x", tensorio.Checksum(e.Data))
}

func inspectJSON(t *testing.T, path string) ckptInfo {
	t.Helper()
	code, out, errs := runCmd("ckpt", "inspect", path, "--json")
	if code != 0 {
		t.Fatalf("ckpt inspect %s: exit %d: %s", path, code, errs)
	}
	var info ckptInfo
	if err := json.Unmarshal([]byte(out), &info); err != nil {
		t.Fatalf("ckpt inspect --json: %v in %q", err, out)
	}
	return info
}

func TestCkptInspectAndExport(t *testing.T) {
	path, c := testCheckpoint(t)
	code, out, errs := runCmd("ckpt", "inspect", path)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	for _, want := range []string{"checkpoint", "job-1", "42", "fc1.weight", "[2 3]", crcOf(c.Params[1].T), "epoch 1, step 7", "model = mlp32"} {
		if !strings.Contains(out, want) {
			t.Errorf("inspect output lacks %q:\n%s", want, out)
		}
	}

	info := inspectJSON(t, path)
	if info.Format != "checkpoint" || info.Job != "job-1" || info.Step == nil || *info.Step != 42 || info.Values != 8 || len(info.Tensors) != 3 {
		t.Fatalf("inspect --json: %+v", info)
	}
	if got, want := info.WeightsSHA256, tensorio.WeightsSHA256(c.Params); got != want {
		t.Errorf("weights sha256 %s, want %s", got, want)
	}
	if tt := info.Tensors[2]; tt.Name != "fc1.weight" || tt.Slot != "m" || tt.DType != "F32" || tt.CRC32C != crcOf(c.Optim[0].T) {
		t.Errorf("optimizer slot: %+v", tt)
	}

	st := filepath.Join(t.TempDir(), "w.safetensors")
	if code, _, errs := runCmd("ckpt", "export", path, "--format", "safetensors", st); code != 0 {
		t.Fatalf("export: exit %d: %s", code, errs)
	}
	ts, _, err := tensorio.LoadSafetensors(st)
	if err != nil {
		t.Fatal(err)
	}
	if len(ts) != 2 || tensorio.WeightsSHA256(ts) != info.WeightsSHA256 {
		t.Fatalf("exported %d tensors, sha %s; want 2, %s", len(ts), tensorio.WeightsSHA256(ts), info.WeightsSHA256)
	}
	sinfo := inspectJSON(t, st)
	if sinfo.Format != "safetensors" || sinfo.Job != "job-1" || sinfo.Step == nil || *sinfo.Step != 42 || sinfo.WeightsSHA256 != info.WeightsSHA256 {
		t.Fatalf("inspect of the export: %+v", sinfo)
	}
	for i, tt := range sinfo.Tensors {
		if want := info.Tensors[i]; tt.Name != want.Name || tt.CRC32C != want.CRC32C || fmt.Sprint(tt.Shape) != fmt.Sprint(want.Shape) {
			t.Errorf("exported tensor %d: %+v, checkpoint has %+v", i, tt, info.Tensors[i])
		}
	}
}

// Bad files give exit status 1 and a message naming the file, bad command
// lines status 2; nothing panics.
func TestCkptBadInput(t *testing.T) {
	path, _ := testCheckpoint(t)
	good, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	flipped := bytes.Clone(good)
	flipped[40] ^= 1
	bigHeader := append([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0}, "{}"...)
	files := map[string]string{
		"truncated":   write("truncated.ckpt", good[:len(good)-5]),
		"flipped":     write("flipped.ckpt", flipped),
		"empty":       write("empty", nil),
		"text":        write("text.txt", []byte("hello, world\n")),
		"bad header":  write("bad.safetensors", append([]byte{8, 0, 0, 0, 0, 0, 0, 0}, "{bad json"...)),
		"huge header": write("huge.safetensors", bigHeader),
		"missing":     filepath.Join(dir, "does-not-exist"),
	}
	for what, p := range files {
		for _, args := range [][]string{
			{"ckpt", "inspect", p},
			{"ckpt", "inspect", "--json", p},
			{"ckpt", "export", p, "--format", "safetensors", filepath.Join(dir, "out.safetensors")},
		} {
			code, out, errs := runCmd(args...)
			if code != 1 || !strings.Contains(errs, filepath.Base(p)) || out != "" {
				t.Errorf("%s: %v: exit %d, stdout %q, stderr %q; want exit 1 and an error naming the file", what, args[:2], code, out, errs)
			}
		}
	}
	for _, args := range [][]string{
		{"ckpt"},
		{"ckpt", "frobnicate"},
		{"ckpt", "inspect"},
		{"ckpt", "inspect", path, path},
		{"ckpt", "export", path},
		{"ckpt", "export", path, filepath.Join(dir, "x"), "--format", "onnx"},
		{"ckpt", "inspect", "--bogus", path},
	} {
		if code, _, errs := runCmd(args...); code != 2 {
			t.Errorf("%v: exit %d (%s), want 2", args, code, errs)
		}
	}
	if code, out, errs := runCmd("ckpt", "inspect", "--json", "--", path); code != 0 || !strings.Contains(out, `"job": "job-1"`) {
		t.Errorf("ckpt inspect --json -- FILE: exit %d, %s", code, errs)
	}
	if code, _, _ := runCmd("ckpt", "inspect", "-h"); code != 0 {
		t.Errorf("ckpt inspect -h: exit %d, want 0", code)
	}
}

// A cut of a model with tied weights exports the tied tensor under each of
// its state_dict names, and the file's fingerprint is the one it records.
func TestCkptExportTiedNames(t *testing.T) {
	_, c := testCheckpoint(t)
	c.Meta["alias.fc1.weight"] = "fc2.weight"
	path := filepath.Join(t.TempDir(), "tied.ckpt")
	if err := tensorio.SaveCheckpoint(path, c); err != nil {
		t.Fatal(err)
	}
	st := filepath.Join(t.TempDir(), "w.safetensors")
	if code, _, errs := runCmd("ckpt", "export", path, "--format", "safetensors", st); code != 0 {
		t.Fatalf("export: exit %d: %s", code, errs)
	}
	b, err := os.ReadFile(st)
	if err != nil {
		t.Fatal(err)
	}
	es, meta, err := tensorio.ParseSafetensors(b)
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]string{}
	for _, e := range es {
		byName[e.Name] = fmt.Sprintf("%x", e.Data)
	}
	if len(es) != 3 || byName["fc2.weight"] == "" || byName["fc2.weight"] != byName["fc1.weight"] {
		t.Fatalf("exported %d tensors; fc2.weight %q, fc1.weight %q", len(es), byName["fc2.weight"], byName["fc1.weight"])
	}
	if sha, _ := tensorio.EntriesSHA256(es); sha != meta["weights_sha256"] || meta["alias.fc1.weight"] != "" {
		t.Errorf("file's fingerprint %s, recorded %s; metadata %v", sha, meta["weights_sha256"], meta)
	}
}
