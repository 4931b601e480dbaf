package tensorio

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"testing/iotest"
	"time"
)

// testCheckpoint builds a checkpoint whose content is a function of its
// arguments, so that a reader can check it is the one written.
func testCheckpoint(job string, step int64, elems int) *Checkpoint {
	r := rand.New(rand.NewPCG(uint64(step), 99))
	c := &Checkpoint{
		JobID: job, Step: step, PlanHash: "plan-abc",
		Data: DataPos{Epoch: step / 100, Step: step % 100},
		RNG:  []byte{1, 2, 3, byte(step)},
		Meta: map[string]string{"model": "mlp32", "lr": "0.01"},
	}
	for i, name := range []string{"layer0.weight", "layer0.bias", "layer1.weight", "layer1.bias"} {
		shape := []int{elems / 4, 4}
		if i%2 == 1 {
			shape = []int{elems / 4}
		}
		t := randTensor(r, shape, fillSpecial)
		c.Params = append(c.Params, Named{Name: name, T: t})
		for _, slot := range []string{"m", "v"} {
			c.Optim = append(c.Optim, OptimState{Param: name, Slot: slot, T: randTensor(r, shape, fillGauss)})
		}
	}
	return c
}

// sameCheckpoint fails unless got equals want, tensors bit for bit.
func sameCheckpoint(t testing.TB, got, want *Checkpoint) {
	t.Helper()
	if got.JobID != want.JobID || got.Step != want.Step || got.PlanHash != want.PlanHash ||
		got.Data != want.Data || !bytes.Equal(got.RNG, want.RNG) ||
		fmt.Sprint(got.Meta) != fmt.Sprint(want.Meta) {
		t.Fatalf("checkpoint header\n%+v\nwant\n%+v", got, want)
	}
	if len(got.Params) != len(want.Params) || len(got.Optim) != len(want.Optim) {
		t.Fatalf("%d params and %d slots, want %d and %d", len(got.Params), len(got.Optim), len(want.Params), len(want.Optim))
	}
	for i, p := range want.Params {
		if got.Params[i].Name != p.Name {
			t.Fatalf("param %d is %q, want %q", i, got.Params[i].Name, p.Name)
		}
		sameBits(t, p.Name, got.Params[i].T, p.T)
	}
	for i, o := range want.Optim {
		g := got.Optim[i]
		if g.Param != o.Param || g.Slot != o.Slot {
			t.Fatalf("slot %d is %q/%q, want %q/%q", i, g.Param, g.Slot, o.Param, o.Slot)
		}
		sameBits(t, o.Param+"/"+o.Slot, g.T, o.T)
	}
}

func TestCheckpointRoundTrip(t *testing.T) {
	c := testCheckpoint("job-1", 42, 64)
	var buf bytes.Buffer
	if err := WriteCheckpoint(&buf, c); err != nil {
		t.Fatal(err)
	}
	got, err := ReadCheckpoint(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	sameCheckpoint(t, got, c)
	// An empty checkpoint (no tensors) is valid too.
	empty := &Checkpoint{JobID: "j", Step: 0}
	buf.Reset()
	if err := WriteCheckpoint(&buf, empty); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadCheckpoint(buf.Bytes()); err != nil {
		t.Fatal(err)
	}
}

// TestCheckpointCorruption flips every byte and cuts the file at every
// length: each damaged file must be rejected with ErrCorrupt, and with the
// same error by every reader: ReadCheckpoint (in memory), VerifyCheckpointAt
// (through an io.ReaderAt) and the io.ReaderAt reader that LoadCheckpoint
// uses.
func TestCheckpointCorruption(t *testing.T) {
	c := testCheckpoint("job-1", 7, 8)
	var buf bytes.Buffer
	if err := WriteCheckpoint(&buf, c); err != nil {
		t.Fatal(err)
	}
	good := buf.Bytes()
	readAt := func(b []byte) (*Checkpoint, error) {
		return readCheckpoint(&ckptFile{r: bytes.NewReader(b), size: int64(len(b))}, true)
	}
	verify := func(b []byte) (*Checkpoint, error) { return VerifyCheckpointAt(bytes.NewReader(b), int64(len(b))) }
	check := func(what string, b []byte) {
		t.Helper()
		_, want := ReadCheckpoint(b)
		if !errors.Is(want, ErrCorrupt) {
			t.Fatalf("%s: %v", what, want)
		}
		for _, read := range []func([]byte) (*Checkpoint, error){verify, readAt} {
			if _, err := read(b); err == nil || err.Error() != want.Error() {
				t.Fatalf("%s: %v, ReadCheckpoint says %v", what, err, want)
			}
		}
	}
	for i := range good {
		b := bytes.Clone(good)
		b[i] ^= 0x40
		check(fmt.Sprintf("byte %d flipped", i), b)
	}
	for n := range len(good) {
		check(fmt.Sprintf("cut at %d", n), good[:n])
	}
	check("trailing byte", append(bytes.Clone(good), 0))
	v, err := VerifyCheckpointAt(bytes.NewReader(good), int64(len(good)))
	if err != nil || v.JobID != c.JobID || v.Step != c.Step || len(v.Params) != len(c.Params) || len(v.Optim) != len(c.Optim) || v.Params[0].T != nil {
		t.Fatalf("VerifyCheckpointAt: %+v, %v", v, err)
	}
	got, err := readAt(good)
	if err != nil {
		t.Fatal(err)
	}
	sameCheckpoint(t, got, c)
}

// SaveFrom stores what it verifies and nothing else: not a damaged file,
// not one its check refuses, not a stream that fails; no temporary stays.
func TestStoreSaveFrom(t *testing.T) {
	dir := t.TempDir()
	s, err := OpenStore(dir, 2)
	if err != nil {
		t.Fatal(err)
	}
	encode := func(c *Checkpoint) []byte {
		var buf bytes.Buffer
		if err := WriteCheckpoint(&buf, c); err != nil {
			t.Fatal(err)
		}
		return buf.Bytes()
	}
	for step := int64(1); step <= 3; step++ {
		got, err := s.SaveFrom(bytes.NewReader(encode(testCheckpoint("job", step, 1000))), nil)
		if err != nil || got.JobID != "job" || got.Step != step {
			t.Fatalf("SaveFrom step %d: %+v %v", step, got, err)
		}
	}
	if steps, _ := s.Steps("job"); fmt.Sprint(steps) != "[2 3]" {
		t.Fatalf("kept steps %v, want [2 3]", steps)
	}
	c, err := s.Latest("job")
	if err != nil {
		t.Fatal(err)
	}
	sameCheckpoint(t, c, testCheckpoint("job", 3, 1000))

	damaged := encode(testCheckpoint("job", 4, 1000))
	damaged[len(damaged)/2] ^= 1
	refused := errors.New("refused")
	for name, tc := range map[string]struct {
		r     io.Reader
		check func(*Checkpoint) error
		want  error
	}{
		"damaged":   {bytes.NewReader(damaged), nil, ErrCorrupt},
		"truncated": {bytes.NewReader(encode(testCheckpoint("job", 4, 1000))[:5000]), nil, ErrCorrupt},
		"refused": {bytes.NewReader(encode(testCheckpoint("job", 4, 1000))), func(c *Checkpoint) error {
			if c.Step != 4 {
				t.Errorf("check sees step %d", c.Step)
			}
			return refused
		}, refused},
		"failing reader": {io.MultiReader(bytes.NewReader(encode(testCheckpoint("job", 4, 1000))[:5000]), iotest.ErrReader(refused)), nil, refused},
	} {
		if _, err := s.SaveFrom(tc.r, tc.check); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", name, err, tc.want)
		}
	}
	if steps, _ := s.Steps("job"); fmt.Sprint(steps) != "[2 3]" {
		t.Errorf("kept steps %v after refused files, want [2 3]", steps)
	}
	left, _ := filepath.Glob(filepath.Join(dir, ".*"))
	if len(left) != 0 {
		t.Errorf("temporaries left: %v", left)
	}
}

func TestCheckpointErrorNamesTensor(t *testing.T) {
	c := testCheckpoint("job-1", 7, 64)
	var buf bytes.Buffer
	if err := WriteCheckpoint(&buf, c); err != nil {
		t.Fatal(err)
	}
	b := buf.Bytes()
	// The frame of layer1.weight's "v" slot: find it through the reader's
	// own view of the file, then flip a payload byte.
	frame, _ := AppendFrame(nil, c.Optim[5].T, CodecRaw)
	at := bytes.Index(b, frame)
	if at < 0 {
		t.Fatal("frame not found")
	}
	b[at+len(frame)-1] ^= 1
	_, err := ReadCheckpoint(b)
	if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), `optimizer slot "v" of "layer1.weight"`) || !strings.Contains(err.Error(), "checksum") {
		t.Fatalf("error does not name the damaged tensor: %v", err)
	}
}

func TestCheckpointValidate(t *testing.T) {
	bad := map[string]func(c *Checkpoint){
		"empty job":      func(c *Checkpoint) { c.JobID = "" },
		"job with slash": func(c *Checkpoint) { c.JobID = "a/b" },
		"negative step":  func(c *Checkpoint) { c.Step = -1 },
		"dup param":      func(c *Checkpoint) { c.Params = append(c.Params, c.Params[0]) },
		"orphan slot":    func(c *Checkpoint) { c.Optim[0].Param = "nope" },
		"dup slot":       func(c *Checkpoint) { c.Optim = append(c.Optim, c.Optim[0]) },
		"nil tensor":     func(c *Checkpoint) { c.Params[0].T = nil },
	}
	for name, edit := range bad {
		c := testCheckpoint("j", 1, 8)
		edit(c)
		if err := WriteCheckpoint(io.Discard, c); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestStore(t *testing.T) {
	dir := t.TempDir()
	s, err := OpenStore(dir, 3)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Latest("job"); !errors.Is(err, ErrNoCheckpoint) {
		t.Fatalf("empty store: %v", err)
	}
	for step := int64(1); step <= 5; step++ {
		if _, err := s.Save(testCheckpoint("job", step, 16)); err != nil {
			t.Fatal(err)
		}
	}
	// Files the store did not write, such as the partial checkpoints of
	// earlier versions, are not its checkpoints.
	for _, name := range []string{"0000000000000000007.stage-1.ckpt", "7.ckpt", "notes.txt"} {
		if err := os.WriteFile(filepath.Join(dir, "job", name), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	steps, _ := s.Steps("job")
	if fmt.Sprint(steps) != "[3 4 5]" {
		t.Fatalf("kept steps %v, want [3 4 5]", steps)
	}
	c, err := s.Latest("job")
	if err != nil || c.Step != 5 {
		t.Fatalf("latest: %v %v", c, err)
	}
	sameCheckpoint(t, c, testCheckpoint("job", 5, 16))
	// Damage the newest: Latest falls back to the one before.
	path := s.Path("job", 5)
	b, _ := os.ReadFile(path)
	b[len(b)/2] ^= 1
	os.WriteFile(path, b, 0o600)
	if c, err := s.Latest("job"); err != nil || c.Step != 4 {
		t.Fatalf("latest with step 5 damaged: %v", err)
	}
	// A file renamed to another step is caught.
	os.Rename(s.Path("job", 3), s.Path("job", 9))
	if c, err := s.Latest("job"); err != nil || c.Step != 4 {
		t.Fatalf("latest with a misnamed file: %v %v", c, err)
	}
	// Nothing valid left: the error lists every file.
	os.Remove(s.Path("job", 4))
	_, err = s.Latest("job")
	if !errors.Is(err, ErrNoCheckpoint) || !errors.Is(err, ErrCorrupt) {
		t.Fatalf("all damaged: %v", err)
	}
	// Temporaries of interrupted writes are removed on open.
	tmp := filepath.Join(dir, "job", "."+filepath.Base(path)+".tmp-123")
	os.WriteFile(tmp, []byte("partial"), 0o600)
	if _, err := OpenStore(dir, 3); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(tmp); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("temporary file survived OpenStore")
	}
}

const crashChildEnv = "TENSORIO_CRASH_CHILD_DIR"

// crashChild writes checkpoints of increasing steps into the store until it
// is killed, printing "saved N" after each Save returns.
func crashChild(dir string) {
	s, err := OpenStore(dir, 2)
	if err != nil {
		fmt.Println("error", err)
		os.Exit(2)
	}
	step := int64(0)
	if c, err := s.Latest("job"); err == nil {
		step = c.Step
	}
	fmt.Println("ready")
	for {
		step++
		if _, err := s.Save(testCheckpoint("job", step, 1<<12)); err != nil {
			fmt.Println("error", err)
			os.Exit(2)
		}
		fmt.Println("saved", step)
	}
}

// TestStoreCrash kills a process that writes checkpoints with SIGKILL at
// random moments, 100 times. Each time the store must load a complete
// checkpoint, the newest one whose Save returned (or the one being
// written, if its rename had happened).
func TestStoreCrash(t *testing.T) {
	if dir := os.Getenv(crashChildEnv); dir != "" {
		crashChild(dir)
		return
	}
	runs := 100
	if testing.Short() {
		runs = 10
	}
	dir := t.TempDir()
	r := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	lastSaved := int64(0)
	midWrite := 0 // kills that left a temporary file behind
	start := time.Now()
	for run := range runs {
		cmd := exec.Command(os.Args[0], "-test.run=^TestStoreCrash$")
		cmd.Env = append(os.Environ(), crashChildEnv+"="+dir)
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		lines := bufio.NewScanner(out)
		if !lines.Scan() || lines.Text() != "ready" {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("run %d: child did not start: %q", run, lines.Text())
		}
		// The kill lands anywhere in the next few Saves.
		time.Sleep(time.Duration(r.IntN(40_000)) * time.Microsecond)
		if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		for lines.Scan() {
			f := strings.Fields(lines.Text())
			if len(f) == 2 && f[0] == "saved" {
				lastSaved, _ = strconv.ParseInt(f[1], 10, 64)
			} else {
				t.Fatalf("run %d: child says %q", run, lines.Text())
			}
		}
		cmd.Wait()
		if tmps, _ := filepath.Glob(filepath.Join(dir, "job", ".*.tmp-*")); len(tmps) > 0 {
			midWrite++
		}
		s, err := OpenStore(dir, 2)
		if err != nil {
			t.Fatal(err)
		}
		c, err := s.Latest("job")
		if lastSaved == 0 && errors.Is(err, ErrNoCheckpoint) {
			continue
		}
		if err != nil {
			t.Fatalf("run %d: after a crash (last saved step %d): %v", run, lastSaved, err)
		}
		if c.Step != lastSaved && c.Step != lastSaved+1 {
			t.Fatalf("run %d: latest checkpoint is step %d, last saved %d", run, c.Step, lastSaved)
		}
		sameCheckpoint(t, c, testCheckpoint("job", c.Step, 1<<12))
		lastSaved = c.Step
	}
	t.Logf("%d crashes (%d in the middle of a write) in %v, reached step %d", runs, midWrite, time.Since(start).Round(time.Millisecond), lastSaved)
}

// A checkpoint file of an earlier ppnode (testdata/v1.ckpt, written by the
// version that still had partial checkpoints) loads, and what it holds is
// written back as the same bytes: the format did not change.
func TestReadsEarlierCheckpointFile(t *testing.T) {
	b, err := os.ReadFile("testdata/v1.ckpt")
	if err != nil {
		t.Fatal(err)
	}
	c, err := ReadCheckpoint(b)
	if err != nil {
		t.Fatal(err)
	}
	if c.JobID != "golden-1" || c.Step != 12 || c.PlanHash != "plan-1" || c.Data != (DataPos{Epoch: 1, Step: 2}) ||
		c.Meta["run"] != "r1" || len(c.Params) != 2 || len(c.Optim) != 1 ||
		fmt.Sprint(c.Params[1].T.Float32s()) != "[-2.5 -1.5 -0.5 0.5 1.5 2.5]" || c.Optim[0].T.Float32s()[4] != 1e-3 {
		t.Fatalf("read %+v", c)
	}
	var out bytes.Buffer
	if err := WriteCheckpoint(&out, c); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(out.Bytes(), b) {
		t.Error("written back as other bytes")
	}
}
