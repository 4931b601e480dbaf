package tensorio

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// Store is a directory of checkpoints that keeps the last few per job. Its
// layout is
//
//	<dir>/<job>/<step, 19 digits>.ckpt
//
// and files starting with "." are temporaries of unfinished writes; other
// files are ignored. A
// Store's methods are safe for concurrent use; a directory must be used by
// one process at a time.
type Store struct {
	dir  string
	keep int
	mu   sync.Mutex // serialises Save's write-and-prune
}

const ckptExt = ".ckpt"

// OpenStore opens (creating it if needed) a store in dir that keeps the
// last keep checkpoints (at least 1) of each job, and removes
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
			if strings.HasPrefix(j.Name(), ".") && strings.Contains(j.Name(), ".tmp-") { // SaveFrom's
				if err := os.Remove(filepath.Join(dir, j.Name())); err != nil {
					return nil, err
				}
			}
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
func (s *Store) Path(job string, step int64) string {
	return filepath.Join(s.dir, job, fmt.Sprintf("%019d", step)+ckptExt)
}

// Save writes c atomically (see SaveCheckpoint) and then removes the
// checkpoints of its job beyond the newest keep. It returns the file's
// path.
func (s *Store) Save(c *Checkpoint) (string, error) {
	if err := c.Validate(); err != nil {
		return "", err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := os.MkdirAll(filepath.Join(s.dir, c.JobID), 0o755); err != nil {
		return "", err
	}
	path := s.Path(c.JobID, c.Step)
	if err := SaveCheckpoint(path, c); err != nil {
		return "", err
	}
	return path, s.prune(c.JobID)
}

// prune removes the checkpoints of job beyond the newest keep.
func (s *Store) prune(job string) error {
	steps, err := s.Steps(job)
	if err != nil {
		return err
	}
	if len(steps) <= s.keep {
		return nil
	}
	for _, st := range steps[:len(steps)-s.keep] {
		if err := os.Remove(s.Path(job, st)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	return syncDir(filepath.Join(s.dir, job))
}

// SaveFrom stores the checkpoint file read from r as Save stores a
// checkpoint, without decoding its tensors or holding the file in memory:
// the bytes go to a temporary file (the copy stops at the first bytes that
// are not a checkpoint header), which is verified where it lies
// (VerifyCheckpointAt), offered to check (if not nil; an error refuses
// it), synced and renamed into place. It returns the checkpoint's metadata
// and names (nil tensors). On any error nothing is stored; errors of the
// bytes wrap ErrCorrupt, r's and check's are returned as they are.
func (s *Store) SaveFrom(r io.Reader, check func(*Checkpoint) error) (c *Checkpoint, err error) {
	t, err := createTemp(s.dir, "recv"+ckptExt)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			t.abort()
		}
	}()
	// Hide the file's ReadFrom, which would copy 32 KiB at a time, so that
	// the copy uses the 1 MiB buffer.
	n, err := io.CopyBuffer(struct{ io.Writer }{t.f}, &headerReader{r: r}, make([]byte, 1<<20))
	if err != nil {
		return nil, err
	}
	if c, err = VerifyCheckpointAt(t.f, n); err != nil {
		return nil, err
	}
	if check != nil {
		if err = check(c); err != nil {
			return nil, err
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err = os.MkdirAll(filepath.Join(s.dir, c.JobID), 0o755); err != nil {
		return nil, err
	}
	if err = t.commit(s.Path(c.JobID, c.Step)); err != nil {
		return nil, err
	}
	return c, s.prune(c.JobID)
}

// headerReader passes r's bytes through, and fails with an error wrapping
// ErrCorrupt as soon as the first ones are not a checkpoint header: a
// stream of garbage is refused at its first read, not once on disk.
type headerReader struct {
	r   io.Reader
	hdr [ckptHeaderLen]byte
	n   int // bytes of hdr seen
}

func (h *headerReader) Read(p []byte) (int, error) {
	n, err := h.r.Read(p)
	if h.n < len(h.hdr) && n > 0 {
		h.n += copy(h.hdr[h.n:], p[:n])
		if cerr := checkCkptHeader(h.hdr[:h.n]); cerr != nil {
			return 0, cerr
		}
	}
	return n, err
}

// Steps lists, in ascending order, the steps for which the store holds a
// checkpoint file of the job (not verified).
func (s *Store) Steps(job string) ([]int64, error) {
	if !validID(job) {
		return nil, fmt.Errorf("tensorio: invalid job %q", job)
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
		num, ok := strings.CutSuffix(f.Name(), ckptExt)
		if !ok || len(num) != 19 {
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
func (s *Store) Load(job string, step int64) (*Checkpoint, error) {
	path := s.Path(job, step)
	c, err := LoadCheckpoint(path)
	if err != nil {
		return nil, err
	}
	if c.JobID != job || c.Step != step {
		return nil, fmt.Errorf("%s: %w: file holds job %q step %d", path, ErrCorrupt, c.JobID, c.Step)
	}
	return c, nil
}

// Latest returns the newest complete, verified checkpoint of the job,
// skipping damaged files. With none it returns an error wrapping
// ErrNoCheckpoint that lists what was wrong with each file.
func (s *Store) Latest(job string) (*Checkpoint, error) {
	steps, err := s.Steps(job)
	if err != nil {
		return nil, err
	}
	var errs []error
	for i := len(steps) - 1; i >= 0; i-- {
		c, err := s.Load(job, steps[i])
		if err == nil {
			return c, nil
		}
		errs = append(errs, err)
	}
	if len(errs) == 0 {
		return nil, fmt.Errorf("%w for job %q in %s", ErrNoCheckpoint, job, s.dir)
	}
	return nil, fmt.Errorf("%w for job %q in %s: %w", ErrNoCheckpoint, job, s.dir, errors.Join(errs...))
}
