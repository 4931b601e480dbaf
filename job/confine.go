package job

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/ppnode/ppnode/data"
)

// ErrOutside is wrapped by the error about a job's file that is not
// inside the directory a node reads job files from.
var ErrOutside = errors.New("outside the node's files directory")

// Paths returns the files s names: its ONNX model, its data file and its
// initial weights.
func (s Spec) Paths() []string {
	var ps []string
	if IsModelFile(s.Model) {
		ps = append(ps, s.Model)
	}
	if data.IsFile(s.Data) {
		ps = append(ps, s.Data)
	}
	if s.Init != "" {
		ps = append(ps, s.Init)
	}
	return ps
}

// Confine refuses a spec whose files are not regular files inside dir:
// each path must be absolute, lexically under dir, and open through
// os.Root (so that no ".." and no symbolic link, of the file or of a
// directory on its way, leads out of dir; os.Root refuses a link with an
// absolute target even if it names a file inside). A node checks a job's spec so
// before it reads any of its files; the error names the path only.
func Confine(s Spec, dir string) error {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return fmt.Errorf("job: the files directory: %w", err)
	}
	defer root.Close()
	abs, err := filepath.Abs(dir)
	if err != nil {
		return fmt.Errorf("job: the files directory: %w", err)
	}
	for _, p := range s.Paths() {
		if err := confine(root, abs, p); err != nil {
			return fmt.Errorf("%w: %w", ErrSpec, err)
		}
	}
	return nil
}

func confine(root *os.Root, dir, p string) error {
	if !filepath.IsAbs(p) {
		return fmt.Errorf("%s: give an absolute path inside %s", p, dir)
	}
	rel, err := filepath.Rel(dir, filepath.Clean(p))
	if err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
		return fmt.Errorf("%s is %w %s (join --files)", p, ErrOutside, dir)
	}
	f, err := root.Open(rel)
	if err != nil {
		if e := unwrapPath(err); e.Error() == rootEscape { // os.Root's refusal, which has no sentinel
			return fmt.Errorf("%s leads %w %s (through a symbolic link)", p, ErrOutside, dir)
		}
		return fmt.Errorf("%s: %w", p, unwrapPath(err))
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("%s: %w", p, unwrapPath(err))
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("%s is not a regular file", p)
	}
	return nil
}

// rootEscape is os.Root's error for a path that leads out of the root.
const rootEscape = "path escapes from parent"

// unwrapPath drops a PathError's own path (relative to the root), so
// that an error names the path the user gave.
func unwrapPath(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}
