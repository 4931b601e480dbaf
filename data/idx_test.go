package data

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"errors"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"testing/iotest"
)

// idxBytes encodes an IDX file with any magic, dims and payload, valid or not.
// writeIDX writes a valid m as an uncompressed IDX file.
func writeIDX(w io.Writer, m *IDX) error {
	hdr := binary.BigEndian.AppendUint32(nil, m.Magic())
	for _, d := range m.Dims {
		hdr = binary.BigEndian.AppendUint32(hdr, uint32(d))
	}
	_, err := w.Write(append(hdr, m.Data...))
	return err
}

func idxBytes(magic uint32, dims []uint32, payload []byte) []byte {
	b := binary.BigEndian.AppendUint32(nil, magic)
	for _, d := range dims {
		b = binary.BigEndian.AppendUint32(b, d)
	}
	return append(b, payload...)
}

func gzipBytes(t testing.TB, b []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	if _, err := zw.Write(b); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func seq(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i * 7)
	}
	return b
}

func TestReadIDXMalformed(t *testing.T) {
	images := idxBytes(IDXImagesMagic, []uint32{2, 3, 4}, seq(24))
	goodGz := gzipBytes(t, images)
	badCRC := slices.Clone(goodGz)
	badCRC[len(badCRC)-8] ^= 0xff // the CRC-32 in the gzip trailer

	tests := []struct {
		name string
		in   []byte
		want string // substring of the error
	}{
		{"empty", nil, "truncated header"},
		{"short magic", []byte{0, 0, 8}, "truncated header"},
		{"bad magic", idxBytes(0x12340803, []uint32{2, 3, 4}, seq(24)), "bad magic 0x12340803"},
		{"wrong dtype", idxBytes(0x00000d03, []uint32{2, 3, 4}, seq(24*4)), "unsupported dtype 0x0d"},
		{"zero dims", idxBytes(0x00000800, nil, nil), "bad number of dimensions 0"},
		{"too many dims", idxBytes(0x000008ff, nil, nil), "bad number of dimensions 255"},
		{"truncated dims", idxBytes(IDXImagesMagic, []uint32{2}, nil), "truncated header"},
		{"zero dimension", idxBytes(IDXImagesMagic, []uint32{2, 0, 4}, nil), "dimension 1 is zero"},
		{"huge declared size", idxBytes(IDXImagesMagic, []uint32{1 << 20, 1 << 10, 1 << 10}, seq(100)), "exceeds the limit"},
		{"max uint32 dims", idxBytes(IDXImagesMagic, []uint32{1<<32 - 1, 1<<32 - 1, 1<<32 - 1}, nil), "exceeds the limit"},
		{"truncated payload", images[:len(images)-1], "truncated payload: got 23 of 24 bytes"},
		{"no payload", idxBytes(IDXLabelsMagic, []uint32{1000}, nil), "truncated payload: got 0 of 1000 bytes"},
		{"trailing bytes", append(slices.Clone(images), 0), "trailing bytes"},
		{"bad gzip", []byte{0x1f, 0x8b, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, "gzip"},
		{"truncated gzip", goodGz[:len(goodGz)/2], "truncated"},
		{"gzip checksum", badCRC, "bad gzip stream"},
		{"garbage after gzip", append(slices.Clone(goodGz), 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12), "bad gzip stream"},
		{"gzip truncated payload", gzipBytes(t, images[:len(images)-2]), "truncated payload: got 22 of 24"},
		{"gzip trailing bytes", gzipBytes(t, append(slices.Clone(images), 1, 2)), "trailing bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := ReadIDX(bytes.NewReader(tt.in), "case.idx")
			if err == nil {
				t.Fatalf("ReadIDX = %v, want an error containing %q", m.Dims, tt.want)
			}
			if !errors.Is(err, ErrCorrupt) {
				t.Errorf("error %q does not wrap ErrCorrupt", err)
			}
			if msg := err.Error(); !strings.Contains(msg, "case.idx") || !strings.Contains(msg, tt.want) {
				t.Errorf("error %q: want the file name and %q", msg, tt.want)
			}
		})
	}
}

// A header declaring 2^40 elements is rejected before the payload is
// allocated, and a header within the limit but without its payload costs
// only what was sent.
func TestReadIDXBoundsAllocation(t *testing.T) {
	for _, dims := range [][]uint32{
		{1 << 20, 1 << 10, 1 << 10},       // 2^40
		{1 << 10, 1 << 10, 1 << 9},        // 2^29, within the limit, no payload
		{1<<32 - 1, 1<<32 - 1, 1<<32 - 1}, // overflow bait
	} {
		in := idxBytes(IDXImagesMagic, dims, seq(1000))
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		_, err := ReadIDX(bytes.NewReader(in), "huge")
		runtime.ReadMemStats(&after)
		if !errors.Is(err, ErrCorrupt) {
			t.Fatalf("dims %v: err = %v, want ErrCorrupt", dims, err)
		}
		if got := after.TotalAlloc - before.TotalAlloc; got > 4<<20 {
			t.Errorf("dims %v: allocated %d bytes, want < 4 MiB", dims, got)
		}
	}
}

func TestReadIDXReaders(t *testing.T) {
	want := &IDX{Name: "r", Dims: []int{3, 5, 7}, Data: seq(3 * 5 * 7)}
	var raw bytes.Buffer
	if err := writeIDX(&raw, want); err != nil {
		t.Fatal(err)
	}
	readers := map[string]func(io.Reader) io.Reader{
		"plain":   func(r io.Reader) io.Reader { return r },
		"onebyte": iotest.OneByteReader,
		"half":    iotest.HalfReader,
		"dataerr": iotest.DataErrReader,
	}
	for _, enc := range []string{"raw", "gzip"} {
		in := raw.Bytes()
		if enc == "gzip" {
			in = gzipBytes(t, in)
		}
		for name, wrap := range readers {
			got, err := ReadIDX(wrap(bytes.NewReader(in)), "r")
			if err != nil {
				t.Fatalf("%s/%s: %v", enc, name, err)
			}
			if !slices.Equal(got.Dims, want.Dims) || !bytes.Equal(got.Data, want.Data) {
				t.Errorf("%s/%s: got dims %v, want %v (or data differs)", enc, name, got.Dims, want.Dims)
			}
			if got.Magic() != IDXImagesMagic {
				t.Errorf("%s/%s: magic 0x%08x", enc, name, got.Magic())
			}
		}
	}
}

// A failing reader is an I/O error, not corruption.
func TestReadIDXIOError(t *testing.T) {
	disk := errors.New("disk on fire")
	in := idxBytes(IDXLabelsMagic, []uint32{10}, seq(10))
	r := io.MultiReader(bytes.NewReader(in[:9]), iotest.ErrReader(disk))
	_, err := ReadIDX(r, "f")
	if !errors.Is(err, disk) || errors.Is(err, ErrCorrupt) {
		t.Fatalf("err = %v, want the reader's error and not ErrCorrupt", err)
	}
	_, err = ReadIDXFile(filepath.Join(t.TempDir(), "missing"))
	if !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing file: err = %v", err)
	}
}

func writeFile(t *testing.T, dir, name string, b []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestReadSplitMalformed(t *testing.T) {
	images := idxBytes(IDXImagesMagic, []uint32{4, 2, 3}, seq(24))
	labels := idxBytes(IDXLabelsMagic, []uint32{4}, []byte{0, 9, 3, 1})
	tests := []struct {
		name           string
		images, labels []byte
		bad            string // "images" or "labels": the file the error must name
		want           string
	}{
		{"count mismatch", images, idxBytes(IDXLabelsMagic, []uint32{3}, []byte{0, 1, 2}), "labels", "count mismatch: 3 labels for 4 images"},
		{"label out of range", images, idxBytes(IDXLabelsMagic, []uint32{4}, []byte{0, 1, 10, 2}), "labels", "label 10 of sample 2 is out of range"},
		{"images not 3-d", idxBytes(0x00000802, []uint32{4, 6}, seq(24)), labels, "images", "want 0x00000803"},
		{"labels not 1-d", images, idxBytes(0x00000802, []uint32{4, 1}, seq(4)), "labels", "want 0x00000801"},
		{"bad labels magic", images, idxBytes(0x01000801, []uint32{4}, seq(4)), "labels", "bad magic"},
		{"truncated images", images[:20], labels, "images", "truncated payload"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			ip := writeFile(t, dir, "images-idx3-ubyte", tt.images)
			lp := writeFile(t, dir, "labels-idx1-ubyte.gz", gzipBytes(t, tt.labels))
			_, err := ReadSplit(ip, lp, 10)
			if err == nil {
				t.Fatalf("ReadSplit succeeded, want %q", tt.want)
			}
			file := map[string]string{"images": ip, "labels": lp}[tt.bad]
			if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), file) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q: want ErrCorrupt naming %s and %q", err, file, tt.want)
			}
		})
	}

	// And the good pair loads, scaled to [0, 1].
	dir := t.TempDir()
	s, err := ReadSplit(writeFile(t, dir, "i", images), writeFile(t, dir, "l", labels), 10)
	if err != nil {
		t.Fatal(err)
	}
	if s.N != 4 || !slices.Equal(s.Shape, []int{2, 3, 1}) || !slices.Equal(s.Y, []float32{0, 9, 3, 1}) {
		t.Fatalf("split N=%d shape %v labels %v", s.N, s.Shape, s.Y)
	}
	for i, b := range seq(24) {
		if want := float32(b) / 255; s.X[i] != want {
			t.Fatalf("X[%d] = %v, want %v", i, s.X[i], want)
		}
	}
	if err := s.Validate(); err != nil {
		t.Fatal(err)
	}
}

func FuzzReadIDX(f *testing.F) {
	f.Add(idxBytes(IDXLabelsMagic, []uint32{3}, []byte{1, 2, 3}))
	f.Add(idxBytes(IDXImagesMagic, []uint32{2, 2, 2}, seq(8)))
	f.Add(gzipBytes(f, idxBytes(IDXImagesMagic, []uint32{1, 3, 3}, seq(9))))
	f.Add(idxBytes(IDXImagesMagic, []uint32{1 << 20, 1 << 10, 1 << 10}, nil))
	f.Add(idxBytes(0x00000d01, []uint32{3}, seq(12)))
	f.Add([]byte{0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff})
	f.Fuzz(func(t *testing.T, in []byte) {
		m, err := ReadIDX(bytes.NewReader(in), "fuzz")
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error %q from an in-memory reader does not wrap ErrCorrupt", err)
			}
			return
		}
		n := 1
		for _, d := range m.Dims {
			n *= d
		}
		if n != len(m.Data) || n > MaxIDXBytes {
			t.Fatalf("dims %v with %d bytes", m.Dims, len(m.Data))
		}
		var buf bytes.Buffer
		if err := writeIDX(&buf, m); err != nil {
			t.Fatal(err)
		}
		m2, err := ReadIDX(&buf, "again")
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(m.Dims, m2.Dims) || !bytes.Equal(m.Data, m2.Data) {
			t.Fatal("round trip changed the file")
		}
	})
}
