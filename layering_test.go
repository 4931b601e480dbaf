package ppnode_test

import (
	"encoding/json"
	"io"
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/ppnode/ppnode"

// allowed lists, for every package, the ppnode packages it may import
// (../shared/DESIGN.md, "Layout"). Lower packages never import higher ones.
var allowed = map[string][]string{
	"clock":       {},
	"nn":          {"nn/internal/sgemm", "nn/internal/dnnl", "nn/internal/openblas"},
	"nn/nntest":   {"nn"},
	"nn/zoo":      {"nn"},
	"data":        {"nn", "tensorio"},
	"tensorio":    {"nn"},
	"balance":     {"nn", "nn/zoo", "tensorio"},
	"cluster":     {"clock"},
	"onnx":        {"nn", "onnx/onnxpb"},
	"onnx/onnxpb": {},
	"job":         {"balance", "data", "nn", "nn/zoo", "onnx", "tensorio"},
	"job/core":    {"balance", "job", "nn", "tensorio"},
	"job/jobtest": {"job"},
	"dataplane":   {"tensorio", "nn", "portrange"},
	"linkprobe":   {"portrange"},
	"portrange":   {},
	"trust":       {},
	"actors":      {"job", "job/core", "clock", "balance", "dataplane", "tensorio", "nn", "nn/zoo", "data"},
	"nodes":       {"actors", "job", "job/core", "dataplane", "linkprobe", "portrange", "trust", "cluster", "balance", "tensorio", "nn", "nn/zoo", "data"},
	"cmd/ppnode":  {"*"},
	"integration": {"*"},
	"bench":       {"*"},

	"nn/internal/sgemm":     {},
	"nn/internal/dnnl":      {},
	"nn/internal/openblas":  {},
	"integration/crossarch": {"*"},
}

func TestLayering(t *testing.T) {
	out, err := exec.Command("go", "list", "-json", "./...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	seen := 0
	for {
		var p struct {
			ImportPath string
			Imports    []string
		}
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		rel := strings.TrimPrefix(strings.TrimPrefix(p.ImportPath, module), "/")
		if rel == "" {
			continue // this test
		}
		seen++
		ok, known := allowed[rel]
		if !known {
			t.Errorf("package %s is not in the layering table; add it with the packages it may import", rel)
			continue
		}
		for _, imp := range p.Imports {
			if !strings.HasPrefix(imp, module+"/") {
				continue
			}
			dep := strings.TrimPrefix(imp, module+"/")
			if !contains(ok, dep) && !contains(ok, "*") {
				t.Errorf("%s imports %s; it may import only %v", rel, dep, ok)
			}
		}
	}
	if seen < 4 {
		t.Fatalf("go list found only %d packages", seen)
	}
}

func contains(s []string, x string) bool {
	for _, v := range s {
		if v == x {
			return true
		}
	}
	return false
}
