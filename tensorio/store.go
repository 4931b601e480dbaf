package tensorio

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// Store is a directory of checkpoints that keeps the last few per job and
// part. Its layout is
//
//	<dir>/<job>/<step, 19 digits>.ckpt          whole-model checkpoints
//	<dir>/<job>/<step, 19 digits>.<part>.ckpt   partial checkpoints
//
// and files starting with "." are temporaries of unfinished writes. A
// Store's methods are safe for concurrent use; a directory must be used by
// one process at a time.
type Store struct {
	dir  string
	keep int
	mu   sync.Mutex // serialises Save's write-and-prune
}

const ckptExt = ".ckpt"

// OpenStore opens (creating it if needed) a store in dir that keeps the
// last keep checkpoints (at least 1) of each job and part, and removes
// temporaries left by writes that a crash interrupted.
func OpenStore(dir string, keep int) (*Store, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	s := &Store{dir: dir, keep: max(keep, 1)}
	jobs, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	for _, j := range jobs {
		if !j.IsDir() {
			continue
		}
		files, err := os.ReadDir(filepath.Join(dir, j.Name()))
		if err != nil {
			return nil, err
		}
		for _, f := range files {
			if strings.HasPrefix(f.Name(), ".") && strings.Contains(f.Name(), ".tmp-") {
				if err := os.Remove(filepath.Join(dir, j.Name(), f.Name())); err != nil {
					return nil, err
				}
			}
		}
	}
	return s, nil
}

// Dir returns the store's directory.
func (s *Store) Dir() string { return s.dir }

// Path returns the file of a checkpoint of the store.
func (s *Store) Path(job, part string, step int64) string {
	name := fmt.Sprintf("%019d", step)
	if part != "" {
		name += "." + part
	}
	return filepath.Join(s.dir, job, name+ckptExt)
}

// Save writes c atomically (see SaveCheckpoint) and then removes the
// checkpoints of its job and part beyond the newest keep. It returns the
// file's path.
func (s *Store) Save(c *Checkpoint) (string, error) {
	if err := c.Validate(); err != nil {
		return "", err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := os.MkdirAll(filepath.Join(s.dir, c.JobID), 0o755); err != nil {
		return "", err
	}
	path := s.Path(c.JobID, c.Part, c.Step)
	if err := SaveCheckpoint(path, c); err != nil {
		return "", err
	}
	steps, err := s.Steps(c.JobID, c.Part)
	if err != nil {
		return path, err
	}
	if len(steps) > s.keep {
		for _, st := range steps[:len(steps)-s.keep] {
			if err := os.Remove(s.Path(c.JobID, c.Part, st)); err != nil && !errors.Is(err, os.ErrNotExist) {
				return path, err
			}
		}
		if err := syncDir(filepath.Join(s.dir, c.JobID)); err != nil {
			return path, err
		}
	}
	return path, nil
}

// Steps lists, in ascending order, the steps for which the store holds a
// checkpoint file of the job and part (not verified).
func (s *Store) Steps(job, part string) ([]int64, error) {
	if !validID(job) || (part != "" && !validID(part)) {
		return nil, fmt.Errorf("tensorio: invalid job %q or part %q", job, part)
	}
	files, err := os.ReadDir(filepath.Join(s.dir, job))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var steps []int64
	for _, f := range files {
		name, ok := strings.CutSuffix(f.Name(), ckptExt)
		if !ok || strings.HasPrefix(name, ".") {
			continue
		}
		num, p, _ := strings.Cut(name, ".")
		if p != part || len(num) != 19 {
			continue
		}
		st, err := strconv.ParseInt(num, 10, 64)
		if err != nil || st < 0 {
			continue
		}
		steps = append(steps, st)
	}
	slices.SortFunc(steps, cmp.Compare)
	return steps, nil
}

// Load reads and verifies one checkpoint of the store, checking that the
// file holds what its name says.
func (s *Store) Load(job, part string, step int64) (*Checkpoint, error) {
	path := s.Path(job, part, step)
	c, err := LoadCheckpoint(path)
	if err != nil {
		return nil, err
	}
	if c.JobID != job || c.Part != part || c.Step != step {
		return nil, fmt.Errorf("%s: %w: file holds job %q part %q step %d", path, ErrCorrupt, c.JobID, c.Part, c.Step)
	}
	return c, nil
}

// Latest returns the newest complete, verified checkpoint of the job and
// part, skipping damaged files. With none it returns an error wrapping
// ErrNoCheckpoint that lists what was wrong with each file.
func (s *Store) Latest(job, part string) (*Checkpoint, error) {
	steps, err := s.Steps(job, part)
	if err != nil {
		return nil, err
	}
	var errs []error
	for i := len(steps) - 1; i >= 0; i-- {
		c, err := s.Load(job, part, steps[i])
		if err == nil {
			return c, nil
		}
		errs = append(errs, err)
	}
	if len(errs) == 0 {
		return nil, fmt.Errorf("%w for job %q part %q in %s", ErrNoCheckpoint, job, part, s.dir)
	}
	return nil, fmt.Errorf("%w for job %q part %q in %s: %w", ErrNoCheckpoint, job, part, s.dir, errors.Join(errs...))
}
