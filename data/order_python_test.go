package data

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// pythonOrder is the interpreter bench/data_order.py runs with (Debian's,
// which has numpy).
const pythonOrder = "/usr/bin/python3"

// orderSplit is a split of n one-value samples, all of class 0: only its
// size matters to a Loader's order.
func orderSplit(n int) *Split {
	return &Split{N: n, Shape: []int{1}, X: make([]float32, n), Y: make([]float32, n), Classes: 1}
}

// runOrderPy runs bench/data_order.py with args and returns its lines, each
// parsed into integers.
func runOrderPy(t *testing.T, args ...string) [][]int64 {
	t.Helper()
	cmd := exec.Command(pythonOrder, append([]string{"../bench/data_order.py"}, args...)...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("data_order.py %v: %v\n%s", args, err, stderr.String())
	}
	var lines [][]int64
	for _, line := range strings.Split(strings.TrimRight(string(out), "\n"), "\n") {
		var vs []int64
		for _, f := range strings.Fields(line) {
			v, err := strconv.ParseInt(f, 10, 64)
			if err != nil {
				t.Fatalf("data_order.py %v printed %q", args, f)
			}
			vs = append(vs, v)
		}
		lines = append(lines, vs)
	}
	return lines
}

func skipWithoutPython(t *testing.T) {
	t.Helper()
	if _, err := os.Stat(pythonOrder); err != nil {
		t.Skipf("%s is missing: bench/data_order.py (the Python copy of the data order) is not checked", pythonOrder)
	}
	if err := exec.Command(pythonOrder, "-c", "import numpy").Run(); err != nil {
		t.Skipf("%s has no numpy: bench/data_order.py (the Python copy of the data order) is not checked", pythonOrder)
	}
	if _, err := os.Stat("../bench/data_order.py"); err != nil {
		t.Skipf("../bench/data_order.py is missing: %v", err)
	}
}

// The Python copy of the order that bench/torch_ref.py trains PyTorch in
// gives Loader.Perm's permutations and Loader.Indices' micro-batches.
func TestPermMatchesPython(t *testing.T) {
	skipWithoutPython(t)
	cases := []struct {
		n     int
		seed  uint64
		epoch int
	}{
		{1000, 1, 0}, {1000, 1, 3}, {1, 1, 0}, {2, 7, 5}, {97, 0, 1},
		{1000, 1<<64 - 1, 2}, {4099, 123456789, 11},
	}
	for _, c := range cases {
		l, err := NewLoader(orderSplit(c.n), c.seed, 1, 1)
		if err != nil {
			t.Fatal(err)
		}
		want := l.Perm(c.epoch)
		lines := runOrderPy(t, "--check", strconv.Itoa(c.n), strconv.FormatUint(c.seed, 10), strconv.Itoa(c.epoch))
		if len(lines) != 1 || len(lines[0]) != len(want) {
			t.Fatalf("N=%d seed %d epoch %d: data_order.py printed %d lines, want one of %d values", c.n, c.seed, c.epoch, len(lines), len(want))
		}
		for i, v := range lines[0] {
			if v != int64(want[i]) {
				t.Fatalf("N=%d seed %d epoch %d: data_order.py's p[%d] = %d, Loader.Perm's %d", c.n, c.seed, c.epoch, i, v, want[i])
			}
		}
	}
}

func TestMicroBatchesMatchPython(t *testing.T) {
	skipWithoutPython(t)
	cases := []struct {
		n           int
		seed        uint64
		batch, m    int
		globalSteps []int
	}{
		{1000, 1, 32, 5, []int{0, 1, 30, 31, 100}}, // 31 steps an epoch: 31 and 100 are in epochs 1 and 3
		{103, 42, 10, 3, []int{0, 9, 10, 25}},
		{50, 3, 7, 7, []int{6, 7}},
	}
	for _, c := range cases {
		l, err := NewLoader(orderSplit(c.n), c.seed, c.batch, c.m)
		if err != nil {
			t.Fatal(err)
		}
		spe := l.StepsPerEpoch()
		for _, g := range c.globalSteps {
			lines := runOrderPy(t, "--micro", strconv.Itoa(c.n), strconv.FormatUint(c.seed, 10),
				strconv.Itoa(c.batch), strconv.Itoa(c.m), strconv.Itoa(g))
			if len(lines) != c.m {
				t.Fatalf("N=%d B=%d M=%d step %d: data_order.py printed %d micro-batches", c.n, c.batch, c.m, g, len(lines))
			}
			for m := range c.m {
				want := l.Indices(g/spe, g%spe, m)
				got := lines[m]
				ok := len(got) == len(want)
				for i := 0; ok && i < len(got); i++ {
					ok = got[i] == int64(want[i])
				}
				if !ok {
					t.Fatalf("N=%d B=%d M=%d step %d micro-batch %d: data_order.py %v, Loader.Indices %v", c.n, c.batch, c.m, g, m, got, want)
				}
			}
		}
	}
}
