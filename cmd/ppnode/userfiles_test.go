package main

import (
	"archive/zip"
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/ppnode/ppnode/onnx/onnxpb"
)

// npy is a version 1.0 .npy file of a little-endian array.
func npy(descr string, shape []int, data any) []byte {
	dims := strings.Trim(strings.ReplaceAll(fmt.Sprint(shape), " ", ", "), "[]")
	if len(shape) == 1 {
		dims += ","
	}
	h := fmt.Sprintf("{'descr': '%s', 'fortran_order': False, 'shape': (%s), }", descr, dims)
	h += strings.Repeat(" ", 63-(10+len(h))%64) + "\n"
	var b bytes.Buffer
	b.WriteString("\x93NUMPY\x01\x00")
	binary.Write(&b, binary.LittleEndian, uint16(len(h)))
	b.WriteString(h)
	binary.Write(&b, binary.LittleEndian, data)
	return b.Bytes()
}

func writeNPZ(t *testing.T, path string, arrays map[string][]byte) {
	t.Helper()
	var b bytes.Buffer
	zw := zip.NewWriter(&b)
	for name, a := range arrays {
		w, _ := zw.Create(name + ".npy")
		w.Write(a)
	}
	zw.Close()
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

// A user's bad file (model, data or weights) is a usage error: exit code 2
// and a message naming the problem, never a panic or a half-run job.
func TestBadUserFiles(t *testing.T) {
	dir := t.TempDir()
	const n = 40
	x := make([]float32, n*24)
	for i := range x {
		x[i] = float32(i%7) - 3
	}
	labels := make([]int64, n)
	for i := range labels {
		labels[i] = int64(i % 5)
	}
	good := filepath.Join(dir, "good.npz")
	writeNPZ(t, good, map[string][]byte{"x": npy("<f4", []int{n, 24}, x), "y": npy("<i8", []int{n}, labels)})
	short := filepath.Join(dir, "short.npz")
	writeNPZ(t, short, map[string][]byte{"x": npy("<f4", []int{n, 24}, x), "y": npy("<i8", []int{n - 1}, labels[1:])})
	floaty := filepath.Join(dir, "floaty.npz")
	ys := make([]float32, n)
	writeNPZ(t, floaty, map[string][]byte{"x": npy("<f4", []int{n, 24}, x), "y": npy("<f4", []int{n}, ys)})

	model, err := os.ReadFile("../../onnx/testdata/towers.onnx")
	if err != nil {
		t.Fatal(err)
	}
	m := &onnxpb.ModelProto{}
	if err := proto.Unmarshal(model, m); err != nil {
		t.Fatal(err)
	}
	m.Graph.Node[3].OpType = proto.String("Det")
	unsupported, _ := proto.Marshal(m)
	files := map[string][]byte{"towers.onnx": model, "unsupported.onnx": unsupported, "truncated.onnx": model[:len(model)/2]}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	mlp := filepath.Join(dir, "mlp.safetensors")
	base := []string{"train", "--local", "--batch", "8", "--micro-batches", "2", "--steps", "1", "--threads", "1"}
	var out, errb bytes.Buffer
	if code := run(append(base, "--model", "mlp32", "--width", "8", "--data", good, "--out", mlp), &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	for _, c := range []struct {
		args []string
		msg  string
	}{
		{[]string{"--model", filepath.Join(dir, "unsupported.onnx"), "--data", good}, "operator Det (node \"/Constant_3\") is not supported; ppnode supports Abs, Add, "},
		{[]string{"--model", filepath.Join(dir, "truncated.onnx"), "--data", good}, "truncated or corrupt"},
		{[]string{"--model", filepath.Join(dir, "towers.onnx"), "--data", short}, "y"},
		{[]string{"--model", filepath.Join(dir, "towers.onnx"), "--data", floaty}, "loss mse scores each output value against a target: the model's output is [N, 5], the data's y is [N]"},
		{[]string{"--model", filepath.Join(dir, "towers.onnx"), "--data", good, "--init", mlp}, "not of this model: it lacks a1.weight"},
	} {
		out.Reset()
		errb.Reset()
		code := run(append(base, c.args...), &out, &errb)
		if code != 2 || !strings.Contains(errb.String(), c.msg) || out.Len() > 0 {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want exit 2 mentioning %q", c.args, code, out.String(), errb.String(), c.msg)
		}
	}
	// The good files train.
	if code := run(append(base, "--model", filepath.Join(dir, "towers.onnx"), "--data", good), &out, &errb); code != 0 {
		t.Errorf("towers.onnx on good.npz: exit %d: %s", code, errb.String())
	}
}
