package ppnode_test

import (
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

const module = "github.com/ppnode/ppnode"

// allowed lists, for every package, the ppnode packages its code imports:
// every arrow it may have, and only arrows it has. Lower packages never
// import higher ones; docs/DESIGN.md draws the layout. "*" allows anything.
var allowed = map[string][]string{
	"clock":       {},
	"cgroup":      {},
	"admit":       {"clock"},
	"nn":          {"nn/internal/sgemm", "nn/internal/dnnl", "nn/internal/openblas"},
	"nn/nntest":   {"nn"},
	"nn/zoo":      {"nn"},
	"data":        {"nn", "tensorio"},
	"tensorio":    {"nn"},
	"balance":     {"nn", "tensorio"},
	"cluster":     {"admit", "clock"},
	"onnx":        {"nn", "onnx/onnxpb"},
	"onnx/onnxpb": {},
	"job":         {"balance", "cgroup", "data", "nn", "nn/zoo", "onnx", "onnx/onnxpb", "tensorio"},
	"job/core":    {"balance", "job", "nn", "tensorio"},
	"job/jobtest": {"job"},
	"dataplane":   {"admit", "tensorio", "nn", "portrange"},
	"linkprobe":   {"admit", "portrange"},
	"portrange":   {},
	"trust":       {},
	"actors":      {"admit", "job", "job/core", "clock", "balance", "dataplane", "tensorio", "nn"},
	"nodes":       {"admit", "actors", "cgroup", "job", "job/core", "dataplane", "linkprobe", "portrange", "trust", "cluster", "balance", "tensorio", "nn"},
	"cmd/ppnode":  {"*"},
	"integration": {"*"},

	"nn/internal/sgemm":     {},
	"nn/internal/dnnl":      {},
	"nn/internal/openblas":  {},
	"integration/crossarch": {"*"},
}

// testOnly lists the ppnode packages a package's tests import besides those
// in allowed: test helpers, and higher packages an external test drives
// the package through.
var testOnly = map[string][]string{
	"nn":        {"nn/nntest", "nn/zoo", "tensorio"},
	"nn/zoo":    {"nn/nntest"},
	"tensorio":  {"data", "nn/zoo"}, // to capture real activations for the codecs
	"balance":   {"nn/zoo"},
	"onnx":      {"tensorio"},
	"dataplane": {"actors"}, // a benchmark sends to a stage actor
	"actors":    {"job/jobtest", "trust"},
	"nodes":     {"job/jobtest"},
}

// pure lists the packages that must stay pure: no I/O, no wall clock, no
// randomness of their own, no goroutine (see TestPurity).
var pure = []string{"job/core"}

// goPackage is what go list says of a package.
type goPackage struct {
	ImportPath, Dir                    string
	Imports, TestImports, XTestImports []string
}

func listPackages(t *testing.T) map[string]goPackage {
	t.Helper()
	out, err := exec.Command("go", "list", "-json", "./...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	pkgs := map[string]goPackage{}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for {
		var p goPackage
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		rel := strings.TrimPrefix(strings.TrimPrefix(p.ImportPath, module), "/")
		if rel != "" { // the root holds only this test
			pkgs[rel] = p
		}
	}
	if len(pkgs) < 4 {
		t.Fatalf("go list found only %d packages", len(pkgs))
	}
	return pkgs
}

// ppnodeImports are the ppnode packages among imports, relative to the
// module, without self.
func ppnodeImports(self string, imports ...[]string) []string {
	var out []string
	for _, list := range imports {
		for _, imp := range list {
			if dep, ok := strings.CutPrefix(imp, module+"/"); ok && dep != self && !slices.Contains(out, dep) {
				out = append(out, dep)
			}
		}
	}
	return out
}

// TestLayering checks every package's imports, its tests' included,
// against the tables, and that the tables name only packages and arrows
// that exist.
func TestLayering(t *testing.T) {
	pkgs := listPackages(t)
	for rel, p := range pkgs {
		ok, known := allowed[rel]
		if !known {
			t.Errorf("package %s is not in the layering table; add it with the packages it may import", rel)
			continue
		}
		star := slices.Contains(ok, "*")
		code := ppnodeImports(rel, p.Imports)
		tests := ppnodeImports(rel, p.TestImports, p.XTestImports)
		for _, dep := range code {
			if !star && !slices.Contains(ok, dep) {
				t.Errorf("%s imports %s; it may import only %v", rel, dep, ok)
			}
		}
		for _, dep := range tests {
			if !star && !slices.Contains(ok, dep) && !slices.Contains(testOnly[rel], dep) {
				t.Errorf("the tests of %s import %s; they may import only %v and %v", rel, dep, ok, testOnly[rel])
			}
		}
		if star {
			continue
		}
		for _, dep := range ok {
			if !slices.Contains(code, dep) {
				t.Errorf("the layering table lets %s import %s, which it does not: remove the arrow (or move it to testOnly if only its tests import it)", rel, dep)
			}
		}
		for _, dep := range testOnly[rel] {
			if !slices.Contains(tests, dep) {
				t.Errorf("the layering table lets the tests of %s import %s, which they do not: remove the arrow", rel, dep)
			}
		}
	}
	for _, tab := range []map[string][]string{allowed, testOnly} {
		for rel := range tab {
			if _, ok := pkgs[rel]; !ok {
				t.Errorf("the layering table names %s, which is not a Go package of the module: remove it", rel)
			}
		}
	}
}

// impureImports are the packages a pure package may not import, by path
// or path prefix (ending in "/"): the file system, the network, the
// system, randomness not passed in, and goroutine machinery.
var impureImports = []string{"os", "os/", "net", "net/", "syscall", "math/rand", "math/rand/v2", "runtime", "sync", "sync/"}

// wallClock are the functions of package time that read the wall clock or
// wait for it; a pure package takes the time as an argument.
var wallClock = []string{"Now", "Since", "Until", "Sleep", "After", "AfterFunc", "NewTimer", "NewTicker", "Tick"}

// TestPurity checks that the non-test files of the pure packages import
// no impure package, call no wall-clock function of package time, and
// contain no go statement.
func TestPurity(t *testing.T) {
	pkgs := listPackages(t)
	for _, rel := range pure {
		p, ok := pkgs[rel]
		if !ok {
			t.Errorf("pure package %s not found", rel)
			continue
		}
		files, err := filepath.Glob(filepath.Join(p.Dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, name := range files {
			if strings.HasSuffix(name, "_test.go") {
				continue
			}
			n++
			for _, problem := range impurities(t, name) {
				t.Errorf("%s/%s", rel, problem)
			}
		}
		if n == 0 {
			t.Errorf("pure package %s has no files", rel)
		}
	}
}

// impurities lists what makes the file name impure, "file:line: what".
func impurities(t *testing.T, name string) []string {
	t.Helper()
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	at := func(pos token.Pos, format string, a ...any) {
		p := fset.Position(pos)
		out = append(out, fmt.Sprintf("%s:%d: %s", filepath.Base(p.Filename), p.Line, fmt.Sprintf(format, a...)))
	}
	timeName := ""
	for _, imp := range f.Imports {
		path, _ := strconv.Unquote(imp.Path.Value)
		for _, bad := range impureImports {
			if path == bad || strings.HasSuffix(bad, "/") && strings.HasPrefix(path, bad) {
				at(imp.Pos(), "imports %s, which a pure package may not", path)
			}
		}
		if path == "time" {
			timeName = "time"
			if imp.Name != nil {
				timeName = imp.Name.Name
			}
			if timeName == "." {
				at(imp.Pos(), "dot-imports time, which hides its clock from this check")
			}
		}
	}
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.GoStmt:
			at(n.Pos(), "starts a goroutine, which a pure package may not")
		case *ast.SelectorExpr:
			if x, ok := n.X.(*ast.Ident); ok && timeName != "" && x.Name == timeName && slices.Contains(wallClock, n.Sel.Name) {
				at(n.Pos(), "uses time.%s: a pure package takes the time as an argument", n.Sel.Name)
			}
		}
		return true
	})
	return out
}
