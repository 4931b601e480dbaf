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

// Files opens the files jobs name inside one directory (`join --files`),
// always through os.Root: a path must be absolute and lexically inside the
// directory, and no ".." or symbolic link, of the file or of a directory on
// its way, may lead out of it, whenever the file is opened (os.Root refuses
// a link with an absolute target even if it names a file inside). A node
// opens it once; a Checked spec given it with ReadingFrom reads its files
// through it, so a file swapped for a link after the spec was checked is
// refused rather than followed. Errors name the path only.
type Files struct {
	root *os.Root
	dir  string // absolute
}

// OpenFiles opens dir for the files of jobs.
func OpenFiles(dir string) (*Files, error) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, fmt.Errorf("job: the files directory: %w", err)
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		root.Close()
		return nil, fmt.Errorf("job: the files directory: %w", err)
	}
	return &Files{root: root, dir: abs}, nil
}

// Close closes the directory; opening through it then fails.
func (f *Files) Close() error { return f.root.Close() }

// Check refuses a spec whose files are not regular files inside the
// directory; a node checks a job's spec so before it reads any of its
// files.
func (f *Files) Check(s Spec) error {
	for _, p := range s.Paths() {
		fl, err := f.Open(p)
		if err != nil {
			return fmt.Errorf("%w: %w", ErrSpec, err)
		}
		fl.Close()
	}
	return nil
}

// Open opens p, an absolute path inside the directory, if it is a regular
// file there.
func (f *Files) Open(p string) (*os.File, error) {
	if !filepath.IsAbs(p) {
		return nil, fmt.Errorf("%s: give an absolute path inside %s", p, f.dir)
	}
	rel, err := filepath.Rel(f.dir, filepath.Clean(p))
	if err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
		return nil, fmt.Errorf("%s is %w %s (join --files)", p, ErrOutside, f.dir)
	}
	fl, err := f.root.Open(rel)
	if err != nil {
		if e := unwrapPath(err); e.Error() == rootEscape { // os.Root's refusal, which has no sentinel
			return nil, fmt.Errorf("%s leads %w %s (through a symbolic link)", p, ErrOutside, f.dir)
		}
		return nil, fmt.Errorf("%s: %w", p, unwrapPath(err))
	}
	fi, err := fl.Stat()
	switch {
	case err != nil:
		fl.Close()
		return nil, fmt.Errorf("%s: %w", p, unwrapPath(err))
	case !fi.Mode().IsRegular():
		fl.Close()
		return nil, fmt.Errorf("%s is not a regular file", p)
	}
	return fl, nil
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
