package tensorio

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/ppnode/ppnode/nn"
)

// allocated returns the bytes the process allocated on the heap while f
// ran (freed or not).
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// garbage is an endless stream of bytes that are not a checkpoint; n
// counts the bytes read from it.
type garbage struct{ n int64 }

func (g *garbage) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = byte(i*7 + 3)
	}
	g.n += int64(len(p))
	return len(p), nil
}

// countReader counts the bytes read through it.
type countReader struct {
	r io.Reader
	n int64
}

func (c *countReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// bigCheckpoint writes a checkpoint of one 64 MiB parameter to path.
func bigCheckpoint(t *testing.T, path string) {
	t.Helper()
	w := nn.New(16<<20, 1)
	for i, x := 0, nn.F32(w); i < len(x); i++ {
		x[i] = float32(i)
	}
	if err := SaveCheckpoint(path, &Checkpoint{JobID: "big", Step: 1, Params: []Named{{"w", w}}}); err != nil {
		t.Fatal(err)
	}
}

// TestSaveFromMemory sends SaveFrom 64 MiB bodies: garbage, a checkpoint
// header followed by garbage, a checkpoint of one 64 MiB tensor and the
// same with a payload byte flipped. Each is verified from the disk:
// SaveFrom allocates less than 8 MiB for any of them (the copy buffer,
// the index, a 1 MiB piece of the file), and the garbage is refused at
// its first read. LoadCheckpoint of the 64 MiB file allocates the tensor
// and less than 8 MiB besides.
func TestSaveFromMemory(t *testing.T) {
	const body, tolerance = 64 << 20, 8 << 20
	dir := t.TempDir()
	s, err := OpenStore(filepath.Join(dir, "store"), 2)
	if err != nil {
		t.Fatal(err)
	}
	src := filepath.Join(dir, "big.ckpt")
	bigCheckpoint(t, src)
	damaged := filepath.Join(dir, "damaged.ckpt")
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 1
	if err := os.WriteFile(damaged, b, 0o600); err != nil {
		t.Fatal(err)
	}
	b = nil

	g := &garbage{}
	open := func(path string) io.Reader {
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		return f
	}
	for _, tc := range []struct {
		name string
		r    io.Reader
		want []string // in the error; none: accepted
	}{
		{"garbage", io.LimitReader(g, body), []string{"not a checkpoint"}},
		{"header then garbage", io.MultiReader(strings.NewReader(ckptMagic+"\x01\x00\x00\x00"), io.LimitReader(&garbage{}, body)), []string{"no end marker"}},
		{"checkpoint", open(src), nil},
		{"damaged checkpoint", open(damaged), []string{`parameter "w"`, "payload checksum"}},
	} {
		var err error
		n := allocated(func() { _, err = s.SaveFrom(tc.r, nil) })
		t.Logf("%s: SaveFrom allocated %.2f MiB: %v", tc.name, float64(n)/(1<<20), err)
		switch {
		case tc.want == nil && err != nil:
			t.Fatalf("%s: %v", tc.name, err)
		case tc.want != nil && !errors.Is(err, ErrCorrupt):
			t.Fatalf("%s: %v, want ErrCorrupt", tc.name, err)
		case n >= tolerance:
			t.Errorf("%s: SaveFrom allocated %d bytes for a body of %d", tc.name, n, body)
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error %q does not say %q", tc.name, err, w)
			}
		}
	}
	if g.n > 1<<20 {
		t.Errorf("%d bytes of garbage read before it was refused", g.n)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, "store", ".*")); len(left) != 0 {
		t.Errorf("temporaries left: %v", left)
	}
	if steps, _ := s.Steps("big"); len(steps) != 1 || steps[0] != 1 {
		t.Fatalf("stored steps %v, want [1]", steps)
	}

	var c *Checkpoint
	n := allocated(func() { c, err = LoadCheckpoint(s.Path("big", 1)) })
	t.Logf("LoadCheckpoint of the 64 MiB file allocated %.2f MiB", float64(n)/(1<<20))
	if err != nil {
		t.Fatal(err)
	}
	if n >= body+tolerance {
		t.Errorf("LoadCheckpoint allocated %d bytes for a tensor of %d", n, body)
	}
	if x := nn.F32(c.Params[0].T); len(x) != 16<<20 || x[12345] != 12345 || x[len(x)-1] != float32(len(x)-1) {
		t.Fatal("loaded tensor differs")
	}
}

// TestSaveFromHeader: SaveFrom refuses a body as soon as its first bytes
// are not a checkpoint header, however the reads cut it, and stores a
// checkpoint that arrives a byte at a time.
func TestSaveFromHeader(t *testing.T) {
	s, err := OpenStore(t.TempDir(), 2)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := WriteCheckpoint(&buf, testCheckpoint("job", 1, 64)); err != nil {
		t.Fatal(err)
	}
	if c, err := s.SaveFrom(iotest.OneByteReader(bytes.NewReader(buf.Bytes())), nil); err != nil || c.Step != 1 {
		t.Fatalf("checkpoint read a byte at a time: %v", err)
	}
	long := strings.Repeat("x", 1<<16)
	for _, tc := range []struct {
		body, want string
		read       int64 // bytes read before the refusal, a byte at a time
	}{
		{"GET / HTTP/1.1" + long, "not a checkpoint", 1},
		{"PPCX" + long, "not a checkpoint", 4},
		{"PPCK\x02" + long, "version 2", 5},
		{"PPCK\x01\x00\x00\x07" + long, "reserved", 8},
		{"", "checkpoint of 0 bytes", 0},
		{"PPCK\x01", "checkpoint of 5 bytes", 5},
	} {
		r := &countReader{r: iotest.OneByteReader(strings.NewReader(tc.body))}
		_, err := s.SaveFrom(r, nil)
		if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), tc.want) || r.n != tc.read {
			t.Errorf("body %.12q: %v after %d bytes, want %q after %d", tc.body, err, r.n, tc.want, tc.read)
		}
	}
	if left, _ := filepath.Glob(filepath.Join(s.Dir(), ".*")); len(left) != 0 {
		t.Errorf("temporaries left: %v", left)
	}
}

// failingReaderAt fails every read that reaches past at.
type failingReaderAt struct {
	r   io.ReaderAt
	at  int64
	err error
}

func (f failingReaderAt) ReadAt(p []byte, off int64) (int, error) {
	if off+int64(len(p)) > f.at {
		return 0, f.err
	}
	return f.r.ReadAt(p, off)
}

// TestVerifyCheckpointAtReader: errors of the reader are the reader's, not
// ErrCorrupt; a file shorter or longer than the size given is corrupt.
func TestVerifyCheckpointAtReader(t *testing.T) {
	var buf bytes.Buffer
	if err := WriteCheckpoint(&buf, testCheckpoint("job", 1, 64)); err != nil {
		t.Fatal(err)
	}
	good := buf.Bytes()
	size := int64(len(good))
	failed := errors.New("disk on fire")
	for _, at := range []int64{0, 100, size / 2, size - 1} {
		_, err := VerifyCheckpointAt(failingReaderAt{bytes.NewReader(good), at, failed}, size)
		if !errors.Is(err, failed) || errors.Is(err, ErrCorrupt) {
			t.Errorf("reader failing past byte %d: %v", at, err)
		}
	}
	if _, err := VerifyCheckpointAt(bytes.NewReader(good), size+10); !errors.Is(err, ErrCorrupt) || !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("size beyond the file: %v", err)
	}
	if _, err := VerifyCheckpointAt(bytes.NewReader(good), size-1); !errors.Is(err, ErrCorrupt) {
		t.Errorf("size short of the file: %v", err)
	}
	// A file that verifies from disk.
	path := filepath.Join(t.TempDir(), "c.ckpt")
	if err := os.WriteFile(path, good, 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if c, err := VerifyCheckpointAt(f, size); err != nil || c.JobID != "job" || len(c.Params) != 4 || c.Params[0].T != nil {
		t.Fatalf("VerifyCheckpointAt of a file: %+v, %v", c, err)
	}
}
