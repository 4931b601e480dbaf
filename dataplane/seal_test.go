package dataplane

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"math/rand/v2"
	"testing"

	"github.com/ppnode/ppnode/tensorio"
)

// sealedStream seals writes of the given sizes and returns the wire bytes,
// where each record starts, and the plain bytes.
func sealedStream(t *testing.T, sizes ...int) (wire []byte, starts []int, plain []byte) {
	t.Helper()
	send, _ := frameKeys(testKey, make([]byte, nonceLen), make([]byte, nonceLen), []byte("hello"))
	var buf bytes.Buffer
	s := &sealer{w: &timedWriter{w: &buf}, aead: send}
	r := rand.New(rand.NewPCG(1, 2))
	for _, n := range sizes {
		p := make([]byte, n)
		for i := range p {
			p[i] = byte(r.Uint32())
		}
		for k := 0; k < n; k += maxSealed {
			starts = append(starts, buf.Len()+k/maxSealed*(sealHdr+sealTag)+k)
		}
		if _, err := s.Write(p); err != nil {
			t.Fatal(err)
		}
		plain = append(plain, p...)
	}
	return buf.Bytes(), starts, plain
}

func openAll(wire []byte, readSize int) ([]byte, error) {
	toListener, _ := frameKeys(testKey, make([]byte, nonceLen), make([]byte, nonceLen), []byte("hello"))
	o := newOpener(bytes.NewReader(wire), toListener)
	var out []byte
	p := make([]byte, readSize)
	for {
		n, err := o.Read(p)
		out = append(out, p[:n]...)
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return out, err
		}
	}
}

// TestSealedRoundTrip: writes of any size come back whole, read with
// buffers shorter and longer than a record.
func TestSealedRoundTrip(t *testing.T) {
	wire, starts, plain := sealedStream(t, 1, 100, maxSealed, 3*maxSealed+7, 5000)
	if want := len(plain) + len(starts)*(sealHdr+sealTag); len(wire) != want {
		t.Fatalf("%d wire bytes for %d records of %d bytes, want %d", len(wire), len(starts), len(plain), want)
	}
	for _, size := range []int{1, 1000, maxSealed, 4 * maxSealed} {
		got, err := openAll(wire, size)
		if err != nil || !bytes.Equal(got, plain) {
			t.Fatalf("reads of %d: %d of %d bytes, %v", size, len(got), len(plain), err)
		}
	}
}

// TestSealedTampering: a record changed, dropped, repeated or swapped, a
// length changed or out of bounds, or a stream cut inside a record is
// refused as corrupt, and no byte of the bad record is returned.
func TestSealedTampering(t *testing.T) {
	wire, starts, plain := sealedStream(t, 300, 200, 100)
	rec := func(i int) []byte {
		end := len(wire)
		if i+1 < len(starts) {
			end = starts[i+1]
		}
		return wire[starts[i]:end]
	}
	cat := func(parts ...[]byte) []byte { return bytes.Join(parts, nil) }
	flip := func(off int) []byte { b := bytes.Clone(wire); b[off] ^= 1; return b }
	withLen := func(n uint32) []byte {
		b := bytes.Clone(wire)
		binary.LittleEndian.PutUint32(b[starts[1]:], n)
		return b
	}
	for name, c := range map[string]struct {
		wire []byte
		good int // plain bytes before the failure
	}{
		"payload bit":  {flip(starts[1] + sealHdr + 5), 300},
		"tag bit":      {flip(starts[2] - 1), 300},
		"dropped":      {cat(rec(0), rec(2)), 300},
		"repeated":     {cat(rec(0), rec(0)), 300},
		"swapped":      {cat(rec(0), rec(2), rec(1)), 300},
		"length":       {withLen(199), 300},
		"zero length":  {withLen(0), 300},
		"huge length":  {withLen(1 << 31), 300},
		"cut in a tag": {wire[:len(wire)-3], 500},
	} {
		t.Run(name, func(t *testing.T) {
			got, err := openAll(c.wire, 1000)
			if !errors.Is(err, tensorio.ErrCorrupt) {
				t.Fatalf("err = %v, want ErrCorrupt", err)
			}
			if !bytes.Equal(got, plain[:c.good]) {
				t.Fatalf("returned %d bytes before the failure, want the %d of the good records", len(got), c.good)
			}
		})
	}
}
