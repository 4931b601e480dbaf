package job_test

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ppnode/ppnode/job"
	"github.com/ppnode/ppnode/onnx"
)

// An error about a file the job names (its --init weights, its data, a
// file that differs between nodes) names the path, never the file's bytes
// or its digest: a user who may submit jobs but not read the file learns
// nothing of it, even through a symlink.
func TestErrorsShowNoFileBytes(t *testing.T) {
	dir := t.TempDir()
	lenPrefixed := binary.LittleEndian.AppendUint64(nil, 16)
	for name, secret := range map[string][]byte{
		"first bytes":      []byte("SECRET!!SECRET!!SECRET!!"),
		"header of a text": append(lenPrefixed, []byte("Qwerty-secret-Qwerty")...),
	} {
		file := filepath.Join(dir, "secret")
		if err := os.WriteFile(file, secret, 0o600); err != nil {
			t.Fatal(err)
		}
		leaks := []string{"SECRET", "Qwerty", "'Q'", fmt.Sprint(binary.LittleEndian.Uint64(secret))}
		for _, kind := range []string{"init", "data"} {
			link := filepath.Join(dir, kind+".safetensors")
			os.Remove(link)
			if err := os.Symlink(file, link); err != nil {
				t.Fatal(err)
			}
			spec := job.DefaultSpec()
			spec.Model, spec.Width, spec.Steps = "mlp32", 16, 1
			if kind == "init" {
				spec.Data, spec.SyntheticSamples, spec.Init = "synthetic:8x8x1:4", 64, link
			} else {
				spec.Data = link
			}
			_, err := prepare(spec)
			if err == nil || !strings.Contains(err.Error(), link) {
				t.Fatalf("%s, --%s through a symlink: %v, want an error naming %s", name, kind, err, link)
			}
			msg := strings.ReplaceAll(err.Error(), dir, "") // the temporary directory's name may hold a leak's digits
			for _, l := range leaks {
				if strings.Contains(msg, l) {
					t.Errorf("%s, --%s: the error %q shows the file's %q", name, kind, err, l)
				}
			}
		}
	}

	// A file that changed after the job was submitted.
	model, b := towersCopy(t, dir)
	spec := job.DefaultSpec()
	spec.Model = model
	if err := spec.HashFiles(); err != nil {
		t.Fatal(err)
	}
	changed := b[:len(b)-1]
	if err := os.WriteFile(model, changed, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := spec.BuildModel(job.Sample{Inputs: []onnx.Input{{Name: "x", Shape: []int{24}}}, Classes: 5})
	got := sha256.Sum256(changed)
	if err == nil || !strings.Contains(err.Error(), model) {
		t.Fatalf("a changed file: %v, want an error naming %s", err, model)
	}
	for _, sum := range []string{hex.EncodeToString(got[:])[:8], spec.Files[model][:8]} {
		if strings.Contains(err.Error(), sum) {
			t.Errorf("the error %q shows a digest (%s...)", err, sum)
		}
	}
}
