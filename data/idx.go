package data

import (
	"bufio"
	"compress/flate"
	"compress/gzip"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
)

// ErrCorrupt is wrapped by every error about the content of a data file:
// errors.Is(err, data.ErrCorrupt) tells a bad file from a failed read.
var ErrCorrupt = errors.New("data: corrupt data file")

const (
	// MaxIDXBytes bounds the payload an IDX header may declare (1 GiB);
	// larger headers are rejected before anything is allocated.
	MaxIDXBytes = 1 << 30
	// MaxIDXDims bounds the number of dimensions of an IDX file.
	MaxIDXDims = 8

	// IDXUint8 is the IDX dtype byte of unsigned bytes, the only one supported.
	IDXUint8 = 0x08

	// IDXImagesMagic and IDXLabelsMagic are the magic numbers of MNIST-style
	// image ([N, H, W]) and label ([N]) files.
	IDXImagesMagic = 0x00000803
	IDXLabelsMagic = 0x00000801

	// firstChunk is the payload buffer's first size; it then doubles as data
	// arrives, so a short payload costs at most about twice what was sent.
	firstChunk = 64 << 10
)

// IDX is a decoded IDX file of unsigned bytes.
type IDX struct {
	Name string // where it came from, for error messages
	Dims []int  // dimensions, outermost first; all > 0
	Data []byte // the elements in row-major order; len(Data) is the product of Dims
}

// Magic returns the file's magic number: 0x0000 | dtype | ndims.
func (m *IDX) Magic() uint32 { return IDXUint8<<8 | uint32(len(m.Dims)) }

func corrupt(name, format string, args ...any) error {
	return fmt.Errorf("%w: %s: %s", ErrCorrupt, name, fmt.Sprintf(format, args...))
}

// readErr classifies a read error: truncation and broken compression are
// corruption; anything else is an I/O error passed on.
func readErr(name, what string, err error) error {
	var ce flate.CorruptInputError
	switch {
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return corrupt(name, "%s", what)
	case errors.Is(err, gzip.ErrHeader), errors.Is(err, gzip.ErrChecksum), errors.As(err, &ce):
		return fmt.Errorf("%w: %s: bad gzip stream (%s): %w", ErrCorrupt, name, what, err)
	}
	return fmt.Errorf("data: %s: read: %w", name, err)
}

// ReadIDX decodes an IDX file of unsigned bytes from r, raw or gzip-compressed
// (detected by the gzip magic bytes). It reads r to its end: bytes after the
// payload are an error. name is used in error messages.
func ReadIDX(r io.Reader, name string) (*IDX, error) {
	br := bufio.NewReader(r)
	var src io.Reader = br
	if head, _ := br.Peek(2); len(head) == 2 && head[0] == 0x1f && head[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, readErr(name, "gzip header", err)
		}
		defer zr.Close()
		src = zr
	}

	var magic [4]byte
	if _, err := io.ReadFull(src, magic[:]); err != nil {
		return nil, readErr(name, "truncated header: no magic number", err)
	}
	if magic[0] != 0 || magic[1] != 0 {
		return nil, corrupt(name, "bad magic 0x%08x: want 0x0000 followed by dtype and number of dimensions (images 0x%08x, labels 0x%08x)",
			binary.BigEndian.Uint32(magic[:]), IDXImagesMagic, IDXLabelsMagic)
	}
	if magic[2] != IDXUint8 {
		return nil, corrupt(name, "unsupported dtype 0x%02x: only unsigned byte 0x%02x is supported", magic[2], IDXUint8)
	}
	ndims := int(magic[3])
	if ndims < 1 || ndims > MaxIDXDims {
		return nil, corrupt(name, "bad number of dimensions %d: want 1 to %d", ndims, MaxIDXDims)
	}
	var hdr [4 * MaxIDXDims]byte
	if _, err := io.ReadFull(src, hdr[:4*ndims]); err != nil {
		return nil, readErr(name, fmt.Sprintf("truncated header: want %d dimensions", ndims), err)
	}
	dims := make([]int, ndims)
	size := uint64(1)
	for i := range dims {
		d := binary.BigEndian.Uint32(hdr[4*i:])
		if d == 0 {
			return nil, corrupt(name, "dimension %d is zero", i)
		}
		dims[i] = int(d)
		size *= uint64(d) // size <= 2^30 and d < 2^32: no overflow
		if size > MaxIDXBytes {
			return nil, corrupt(name, "declared size %v exceeds the limit of %d bytes", headerDims(hdr[:4*ndims]), MaxIDXBytes)
		}
	}

	// Grow the buffer as data arrives, so that a header whose size is within
	// the limit but whose payload is short costs only what was sent.
	n := int(size)
	buf := make([]byte, 0, min(n, firstChunk))
	for len(buf) < n {
		if len(buf) == cap(buf) {
			nb := make([]byte, len(buf), min(n, 2*cap(buf)))
			copy(nb, buf)
			buf = nb
		}
		k, err := io.ReadFull(src, buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+k]
		if err != nil {
			return nil, readErr(name, fmt.Sprintf("truncated payload: got %d of %d bytes for dimensions %v", len(buf), n, dims), err)
		}
	}
	var one [1]byte
	switch k, err := io.ReadFull(src, one[:]); {
	case k > 0:
		return nil, corrupt(name, "trailing bytes after the payload of %d bytes for dimensions %v", n, dims)
	case err != io.EOF:
		return nil, readErr(name, "stream ends early after the payload", err)
	}
	return &IDX{Name: name, Dims: dims, Data: buf}, nil
}

func headerDims(b []byte) []uint32 {
	d := make([]uint32, len(b)/4)
	for i := range d {
		d[i] = binary.BigEndian.Uint32(b[4*i:])
	}
	return d
}

// ReadIDXFile reads the IDX file at path (raw or gzip-compressed).
func ReadIDXFile(path string) (*IDX, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("data: %w", err)
	}
	defer f.Close()
	return ReadIDX(f, path)
}
