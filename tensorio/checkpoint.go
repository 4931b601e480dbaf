package tensorio

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"os"

	"github.com/ppnode/ppnode/nn"
)

// Checkpoint file layout (integers little-endian):
//
//	+--------+-----+--------+-----------------------+------------+----------------------------------+
//	| "PPCK" | ver | 3 zero | frames, one per tensor | index JSON | footer: index length u32,        |
//	|        |  1  |        | (frame format above)   |            | index CRC-32C u32, "PPCKEND\n"   |
//	+--------+-----+--------+-----------------------+------------+----------------------------------+
//
// The index names every tensor (parameter, or optimizer slot of a
// parameter) with its shape and the offset and length of its frame, and
// holds the metadata. Frames tile the space between the 8-byte header and
// the index exactly. Every frame carries its own checksums and the index
// has one, so every byte of the file is covered; a file cut anywhere
// fails (the footer is last).
const (
	ckptMagic     = "PPCK"
	ckptVersion   = 1
	ckptEndMagic  = "PPCKEND\n"
	ckptHeaderLen = 8
	ckptFooterLen = 16

	// MaxCheckpointIndex bounds the JSON index of a checkpoint file.
	MaxCheckpointIndex = 64 << 20
)

// Checkpoint is the state of a training job after a step: the parameters,
// the optimizer state and where training resumes.
type Checkpoint struct {
	JobID    string
	Step     int64  // the step this state is the result of
	PlanHash string // the plan that produced it
	Data     DataPos
	RNG      []byte            // generator state, opaque to tensorio
	Meta     map[string]string // anything else
	Params   []Named
	Optim    []OptimState
}

// DataPos is the position in the deterministic data order where training
// resumes.
type DataPos struct {
	Epoch int64 `json:"epoch"`
	Step  int64 `json:"step"`
}

// OptimState is one optimizer tensor of a parameter, such as Adam's "m"
// and "v" moments.
type OptimState struct {
	Param string
	Slot  string
	T     *nn.Tensor
}

// ckptIndex is the JSON index of a checkpoint file.
type ckptIndex struct {
	Job     string            `json:"job"`
	Step    int64             `json:"step"`
	Plan    string            `json:"plan,omitempty"`
	Data    DataPos           `json:"data"`
	RNG     []byte            `json:"rng,omitempty"`
	Meta    map[string]string `json:"meta,omitempty"`
	Tensors []ckptTensor      `json:"tensors"`
}

type ckptTensor struct {
	Name   string `json:"name"`
	Slot   string `json:"slot,omitempty"` // empty for a parameter
	Shape  []int  `json:"shape"`
	Offset int64  `json:"offset"`
	Length int64  `json:"length"`
}

func (t ckptTensor) what() string {
	if t.Slot == "" {
		return fmt.Sprintf("parameter %q", t.Name)
	}
	return fmt.Sprintf("optimizer slot %q of %q", t.Slot, t.Name)
}

// validID reports whether s may name a job: 1 to 128 of [A-Za-z0-9_-].
// (Such names appear in file names.)
func validID(s string) bool {
	if len(s) == 0 || len(s) > 128 {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-') {
			return false
		}
	}
	return true
}

// Validate checks that the checkpoint can be written: a valid job ID, a
// non-negative step, unique non-empty parameter names, unique
// optimizer slots that belong to parameters of the checkpoint, and
// contiguous tensors.
func (c *Checkpoint) Validate() error { return c.validate(true) }

// validate is Validate, checking the tensors only if tensors.
func (c *Checkpoint) validate(tensors bool) error {
	if !validID(c.JobID) {
		return fmt.Errorf("tensorio: checkpoint job ID %q is not 1 to 128 of [A-Za-z0-9_-]", c.JobID)
	}
	if c.Step < 0 {
		return fmt.Errorf("tensorio: checkpoint step %d is negative", c.Step)
	}
	params := make(map[string]bool, len(c.Params))
	for _, p := range c.Params {
		if p.Name == "" {
			return fmt.Errorf("tensorio: checkpoint parameter with an empty name")
		}
		if params[p.Name] {
			return fmt.Errorf("tensorio: checkpoint parameter %q appears twice", p.Name)
		}
		params[p.Name] = true
		if _, err := tensorData(p.T); tensors && err != nil {
			return fmt.Errorf("tensorio: checkpoint parameter %q: %w", p.Name, err)
		}
	}
	slots := make(map[[2]string]bool, len(c.Optim))
	for _, o := range c.Optim {
		if !params[o.Param] {
			return fmt.Errorf("tensorio: optimizer slot %q belongs to %q, which is not a parameter of the checkpoint", o.Slot, o.Param)
		}
		if o.Slot == "" {
			return fmt.Errorf("tensorio: optimizer slot of %q has an empty name", o.Param)
		}
		k := [2]string{o.Param, o.Slot}
		if slots[k] {
			return fmt.Errorf("tensorio: optimizer slot %q of %q appears twice", o.Slot, o.Param)
		}
		slots[k] = true
		if _, err := tensorData(o.T); tensors && err != nil {
			return fmt.Errorf("tensorio: optimizer slot %q of %q: %w", o.Slot, o.Param, err)
		}
	}
	return nil
}

// countWriter counts the bytes written through it.
type countWriter struct {
	w io.Writer
	n int64
}

func (cw *countWriter) Write(p []byte) (int, error) {
	n, err := cw.w.Write(p)
	cw.n += int64(n)
	return n, err
}

// WriteCheckpoint validates c and writes it to w (see the layout above).
// Tensors are written raw: parameters and optimizer state do not compress.
func WriteCheckpoint(w io.Writer, c *Checkpoint) error {
	if err := c.Validate(); err != nil {
		return err
	}
	cw := &countWriter{w: w}
	if _, err := cw.Write([]byte{'P', 'P', 'C', 'K', ckptVersion, 0, 0, 0}); err != nil {
		return err
	}
	idx := ckptIndex{
		Job: c.JobID, Step: c.Step, Plan: c.PlanHash,
		Data: c.Data, RNG: c.RNG, Meta: c.Meta,
		Tensors: make([]ckptTensor, 0, len(c.Params)+len(c.Optim)),
	}
	fw := NewWriter(cw, CodecRaw)
	put := func(name, slot string, t *nn.Tensor) error {
		at := cw.n
		if err := fw.WriteTensor(t); err != nil {
			return err
		}
		idx.Tensors = append(idx.Tensors, ckptTensor{
			Name: name, Slot: slot, Shape: append([]int{}, t.Shape()...),
			Offset: at, Length: cw.n - at,
		})
		return nil
	}
	for _, p := range c.Params {
		if err := put(p.Name, "", p.T); err != nil {
			return err
		}
	}
	for _, o := range c.Optim {
		if err := put(o.Param, o.Slot, o.T); err != nil {
			return err
		}
	}
	js, err := json.Marshal(&idx)
	if err != nil {
		return err
	}
	if len(js) > MaxCheckpointIndex {
		return fmt.Errorf("tensorio: checkpoint index of %d bytes exceeds %d", len(js), MaxCheckpointIndex)
	}
	var foot [ckptFooterLen]byte
	binary.LittleEndian.PutUint32(foot[0:], uint32(len(js)))
	binary.LittleEndian.PutUint32(foot[4:], crc(js))
	copy(foot[8:], ckptEndMagic)
	if _, err := cw.Write(js); err != nil {
		return err
	}
	_, err = cw.Write(foot[:])
	return err
}

// ReadCheckpoint parses and verifies a checkpoint file held in data. It
// returns the complete checkpoint or an error wrapping ErrCorrupt that
// names what is wrong; the tensors do not alias data.
func ReadCheckpoint(data []byte) (*Checkpoint, error) {
	return readCheckpoint(&ckptFile{data: data, size: int64(len(data))}, true)
}

// VerifyCheckpointAt checks the checkpoint file of size bytes that r reads
// as ReadCheckpoint does (layout, index, every frame and its checksum)
// without keeping its tensors: the checkpoint it returns has the metadata
// and the parameter and slot names, with nil tensors. It reads the header,
// the footer and the index (its length checked against the file and
// MaxCheckpointIndex, its checksum computed, before it is read into
// memory), then each frame's header, and checksums each payload in pieces
// of 1 MiB: besides the index it allocates about 1 MiB, whatever the size
// of the file. (A frame of a codec other than raw, which WriteCheckpoint
// never writes, is decoded once its checksum matches.) Errors of the
// bytes wrap ErrCorrupt; r's errors are returned wrapped.
func VerifyCheckpointAt(r io.ReaderAt, size int64) (*Checkpoint, error) {
	return readCheckpoint(&ckptFile{r: r, size: size}, false)
}

// readCheckpoint reads and verifies f, decoding its tensors if keep.
func readCheckpoint(f *ckptFile, keep bool) (*Checkpoint, error) {
	if err := f.header(); err != nil {
		return nil, err
	}
	idx, end, err := f.index()
	if err != nil {
		return nil, err
	}
	c := &Checkpoint{
		JobID: idx.Job, Step: idx.Step, PlanHash: idx.Plan,
		Data: idx.Data, RNG: idx.RNG, Meta: idx.Meta,
	}
	// Frames must tile [header, index) in index order.
	at := int64(ckptHeaderLen)
	for _, e := range idx.Tensors {
		if e.Offset != at || e.Length < 0 || e.Length > end-at {
			return nil, corruptf("checkpoint %s: frame at [%d, +%d) does not follow the previous one (at %d) within the file", e.what(), e.Offset, e.Length, at)
		}
		t, shape, n, err := f.frame(at, e.Length, keep)
		if err != nil {
			return nil, fmt.Errorf("checkpoint %s: %w", e.what(), err)
		}
		if n != e.Length {
			return nil, corruptf("checkpoint %s: frame of %d bytes in a slot of %d", e.what(), n, e.Length)
		}
		at += e.Length
		if want := e.Shape; !nn.SameShape(shape, want) && !(len(want) == 0 && nn.SameShape(shape, []int{1})) {
			return nil, corruptf("checkpoint %s: frame shape %v, index says %v", e.what(), shape, want)
		}
		if e.Slot == "" {
			c.Params = append(c.Params, Named{Name: e.Name, T: t})
		} else {
			c.Optim = append(c.Optim, OptimState{Param: e.Name, Slot: e.Slot, T: t})
		}
	}
	if at != end {
		return nil, corruptf("checkpoint has %d unaccounted bytes before its index", end-at)
	}
	if err := c.validate(keep); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	return c, nil
}

// SaveCheckpoint writes c to path atomically: a reader of path sees the
// old file or the complete new one, even after a crash.
func SaveCheckpoint(path string, c *Checkpoint) error {
	if err := c.Validate(); err != nil {
		return err
	}
	return writeFileAtomic(path, func(w io.Writer) error { return WriteCheckpoint(w, c) })
}

// LoadCheckpoint reads and verifies the checkpoint file at path, a frame
// at a time: raw payloads are read straight into their tensors, so it
// holds the tensors, not the file as well.
func LoadCheckpoint(path string) (*Checkpoint, error) {
	file, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer file.Close()
	st, err := file.Stat()
	if err != nil {
		return nil, err
	}
	c, err := readCheckpoint(&ckptFile{r: file, size: st.Size()}, true)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}
