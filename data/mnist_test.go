package data

import (
	"os"
	"path/filepath"
	"testing"
)

// A binary installed with MNIST beside it (make build, make install) finds
// the files without Go or the module proxy.
func TestMNISTBesideTheBinary(t *testing.T) {
	t.Setenv(MNISTDirEnv, "")
	dirs := InstalledMNISTDirs()
	if len(dirs) != 2 {
		t.Fatalf("InstalledMNISTDirs: %v", dirs)
	}
	dir := dirs[0] // mnist/ beside this test binary
	if _, err := os.Stat(dir); err == nil {
		t.Skipf("%s exists already", dir)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Skipf("cannot write beside the test binary: %v", err)
	}
	defer os.RemoveAll(dir)
	if err := os.WriteFile(filepath.Join(dir, "t10k-labels-idx1-ubyte.gz"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", "") // no go command to fetch the module with
	got, err := MNISTDir()
	if err != nil || got != dir {
		t.Errorf("MNISTDir() = %q, %v; want %q", got, err, dir)
	}
}
