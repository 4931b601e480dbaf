package tensorio

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"

	"github.com/ppnode/ppnode/nn"
)

// ckptChunk is the largest piece of a checkpoint file read at once to
// checksum it: verifying a file read through an io.ReaderAt allocates
// about this much besides the index, whatever the size of its tensors.
const ckptChunk = 1 << 20

// ckptFile is a checkpoint file being read: held whole in memory (data),
// or read through r a piece at a time into buf.
type ckptFile struct {
	data []byte
	r    io.ReaderAt
	size int64
	buf  []byte
}

// read returns the n bytes at off, which the caller has checked lie within
// size: a slice of data, or buf filled from r (valid until the next read).
func (f *ckptFile) read(off, n int64) ([]byte, error) {
	if f.r == nil {
		return f.data[off : off+n], nil
	}
	f.buf = resize(f.buf, int(n))
	if err := f.readInto(f.buf, off); err != nil {
		return nil, err
	}
	return f.buf, nil
}

// readInto fills p with the bytes at off from r. A file shorter than its
// size is corrupt; r's other errors are returned wrapped.
func (f *ckptFile) readInto(p []byte, off int64) error {
	got, err := f.r.ReadAt(p, off)
	switch {
	case got == len(p):
		return nil // err may be io.EOF at the very end
	case err == io.EOF || err == nil:
		return corruptWrap(io.ErrUnexpectedEOF, "checkpoint ends at byte %d, its size is %d", off+int64(got), f.size)
	}
	return fmt.Errorf("tensorio: reading checkpoint at byte %d: %w", off, err)
}

// crc returns the CRC-32C of the n bytes at off, reading at most ckptChunk
// bytes at a time.
func (f *ckptFile) crc(off, n int64) (uint32, error) {
	if f.r == nil {
		return crc(f.data[off : off+n]), nil
	}
	var c uint32
	for n > 0 {
		b, err := f.read(off, min(n, ckptChunk))
		if err != nil {
			return 0, err
		}
		c = crcUpdate(c, b)
		off, n = off+int64(len(b)), n-int64(len(b))
	}
	return c, nil
}

// checkCkptHeader checks b, the first bytes (up to ckptHeaderLen) of a
// checkpoint file; a good prefix of a header passes.
func checkCkptHeader(b []byte) error {
	if m := b[:min(len(b), len(ckptMagic))]; string(m) != ckptMagic[:len(m)] {
		return corruptf("not a checkpoint: no %s magic", ckptMagic)
	}
	if len(b) > 4 && b[4] != ckptVersion {
		return corruptf("unsupported checkpoint version %d", b[4])
	}
	if len(b) > 5 {
		if r := b[5:min(len(b), ckptHeaderLen)]; string(r) != "\x00\x00\x00"[:len(r)] {
			return corruptf("checkpoint header has non-zero reserved bytes")
		}
	}
	return nil
}

// header checks the file's size and its header.
func (f *ckptFile) header() error {
	if f.size < ckptHeaderLen+ckptFooterLen {
		return corruptWrap(io.ErrUnexpectedEOF, "checkpoint of %d bytes", f.size)
	}
	b, err := f.read(0, ckptHeaderLen)
	if err != nil {
		return err
	}
	return checkCkptHeader(b)
}

// index reads the footer and the index it describes, and returns the
// index and its offset (where the frames end). The index's length is
// checked against the file and MaxCheckpointIndex, and its checksum
// computed, before it is read into memory.
func (f *ckptFile) index() (*ckptIndex, int64, error) {
	foot, err := f.read(f.size-ckptFooterLen, ckptFooterLen)
	if err != nil {
		return nil, 0, err
	}
	if string(foot[8:]) != ckptEndMagic {
		return nil, 0, corruptWrap(io.ErrUnexpectedEOF, "checkpoint has no end marker (truncated?)")
	}
	il := int64(binary.LittleEndian.Uint32(foot))
	want := binary.LittleEndian.Uint32(foot[4:])
	indexEnd := f.size - ckptFooterLen
	if il > MaxCheckpointIndex || il > indexEnd-ckptHeaderLen {
		return nil, 0, corruptf("checkpoint index length %d out of range", il)
	}
	at := indexEnd - il
	got, err := f.crc(at, il)
	if err != nil {
		return nil, 0, err
	}
	if got != want {
		return nil, 0, corruptf("checkpoint index checksum %08x, want %08x", got, want)
	}
	js, err := f.read(at, il)
	if err != nil {
		return nil, 0, err
	}
	var idx ckptIndex
	if err := json.Unmarshal(js, &idx); err != nil {
		return nil, 0, corruptWrap(err, "checkpoint index")
	}
	return &idx, at, nil
}

// frameHeader reads and parses the header of the frame in the n bytes at
// off and checks that its payload lies within them. It returns the header
// and its length.
func (f *ckptFile) frameHeader(off, n int64) (frameHeader, int64, error) {
	b, err := f.read(off, min(n, maxFrameHeader))
	if err != nil {
		return frameHeader{}, 0, err
	}
	h, hl, err := parseFrameHeader(b, MaxElements)
	if err == io.ErrUnexpectedEOF {
		return h, 0, corruptWrap(err, "truncated frame header (%d bytes)", n)
	}
	if err != nil {
		return h, 0, err
	}
	if n-int64(hl) < int64(h.encLen) {
		return h, 0, corruptWrap(io.ErrUnexpectedEOF, "truncated frame: %d of %d payload bytes", n-int64(hl), h.encLen)
	}
	return h, int64(hl), nil
}

// frame verifies the frame in the n bytes at off as DecodeFrame does and
// returns its tensor (if keep; nil otherwise), its shape and its size.
// Read through r, its header comes first; then a raw payload is read
// straight into the tensor if keep, else checksummed a piece at a time. A
// frame of another codec is read whole (and decoded) only once its
// checksum matches.
func (f *ckptFile) frame(off, n int64, keep bool) (*nn.Tensor, []int, int64, error) {
	if keep && f.r == nil {
		t, size, err := DecodeFrame(f.data[off:off+n], nil)
		if err != nil {
			return nil, nil, 0, err
		}
		return t, t.Shape(), int64(size), nil
	}
	h, hl, err := f.frameHeader(off, n)
	if err != nil {
		return nil, nil, 0, err
	}
	size := hl + int64(h.encLen)
	if keep && h.codec == CodecRaw && nativeLE {
		t, err := f.rawTensor(&h, off+hl)
		return t, h.shape(), size, err
	}
	sum, err := f.crc(off+hl, int64(h.encLen))
	if err != nil {
		return nil, nil, 0, err
	}
	if sum != h.payloadCRC {
		return nil, nil, 0, corruptf("frame payload checksum %08x, want %08x", sum, h.payloadCRC)
	}
	if h.codec == CodecRaw && !keep {
		return nil, h.shape(), size, nil
	}
	b, err := f.read(off, size)
	if err != nil {
		return nil, nil, 0, err
	}
	if !keep {
		shape, _, err := checkFrame(b)
		return nil, shape, size, err
	}
	t, _, err := DecodeFrame(b, nil)
	if err != nil {
		return nil, nil, 0, err
	}
	return t, t.Shape(), size, nil
}

// rawTensor reads the raw payload of h at off into a new tensor (whose
// size the file's own bytes bound) and checks its checksum.
func (f *ckptFile) rawTensor(h *frameHeader, off int64) (*nn.Tensor, error) {
	t := tensorFor(nil, h.shape(), h.n)
	b := f32View(nn.F32(t))
	if err := f.readInto(b, off); err != nil {
		return nil, err
	}
	if got := crc(b); got != h.payloadCRC {
		return nil, corruptf("frame payload checksum %08x, want %08x", got, h.payloadCRC)
	}
	return t, nil
}
