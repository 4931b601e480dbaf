package tensorio

import (
	"bufio"
	"io"
	"os"
	"path/filepath"
)

// writeFileAtomic writes a file so that path holds either its old content
// or the complete new one, even across a crash: the data goes to a
// temporary file in the same directory (named ".<base>.tmp-*"), which is
// synced, renamed over path, and the directory synced.
func writeFileAtomic(path string, write func(w io.Writer) error) (err error) {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	t, err := createTemp(dir, base)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			t.abort()
		}
	}()
	bw := bufio.NewWriterSize(t.f, 1<<20)
	if err = write(bw); err != nil {
		return err
	}
	if err = bw.Flush(); err != nil {
		return err
	}
	return t.commit(path)
}

// tempFile is a file written under a temporary name and then committed
// under its final one (or aborted).
type tempFile struct {
	f    *os.File
	name string
}

// createTemp creates ".<base>.tmp-*" in dir (OpenStore removes leftovers).
func createTemp(dir, base string) (*tempFile, error) {
	f, err := os.CreateTemp(dir, "."+base+".tmp-*")
	if err != nil {
		return nil, err
	}
	return &tempFile{f: f, name: f.Name()}, nil
}

// commit syncs the file, renames it to path and syncs the directories
// involved.
func (t *tempFile) commit(path string) error {
	if err := t.f.Sync(); err != nil {
		return err
	}
	if err := t.f.Close(); err != nil {
		return err
	}
	if err := os.Rename(t.name, path); err != nil {
		return err
	}
	if from, to := filepath.Dir(t.name), filepath.Dir(path); from != to {
		if err := syncDir(from); err != nil {
			return err
		}
	}
	return syncDir(filepath.Dir(path))
}

// abort closes and removes the file (after a failed commit, whatever is
// left of it).
func (t *tempFile) abort() {
	t.f.Close()
	os.Remove(t.name)
}

// syncDir makes a rename or removal in dir durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
