package tensorio

import (
	"fmt"
	"hash/crc32"
	"math/bits"
	"math/rand/v2"
	"testing"
)

// TestCRC checks crcUpdate and copyCRC against hash/crc32 at lengths
// around the folding kernel's block size and at every alignment mod 64.
func TestCRC(t *testing.T) {
	if !hasFold {
		t.Log("no AVX-512 VPCLMULQDQ: testing the hash/crc32 fallback only")
	}
	r := rand.New(rand.NewPCG(31, 32))
	buf := make([]byte, ntMin+1<<16)
	for i := range buf {
		buf[i] = byte(r.Uint32())
	}
	dst := make([]byte, len(buf)+64)
	lengths := []int{0, 1, 255, 256, foldMin - 1, foldMin, foldMin + 1, foldMin + 255, foldMin + 256, hybridMin - 1, hybridMin, hybridMin + 1,
		4 * hybridBlock, 4*hybridBlock + 1, 4096 + 100, 1 << 16, 1 << 20, 1<<20 - 1, ntMin - 1, ntMin + 1000}
	for _, n := range lengths {
		for _, off := range []int{0, 1, 7, 8, 31, 63} {
			src := buf[off : off+n]
			want := crc32.Checksum(src, castagnoli)
			if got := crc(src); got != want {
				t.Fatalf("crc(%d bytes at +%d) = %08x, want %08x", n, off, got, want)
			}
			if got := crcUpdate(0x12345678, src); got != crc32.Update(0x12345678, castagnoli, src) {
				t.Fatalf("crcUpdate(%d bytes at +%d) = %08x", n, off, got)
			}
			d := dst[(off*5)%64:]
			clear(d[:n+1])
			if got := copyCRC(d, src); got != want {
				t.Fatalf("copyCRC(%d bytes at +%d) = %08x, want %08x", n, off, got, want)
			}
			if string(d[:n]) != string(src) || d[n] != 0 {
				t.Fatalf("copyCRC(%d bytes at +%d): copy differs or overruns", n, off)
			}
		}
	}
	// Random lengths: the hybrid kernel joins its streams with x^8L mod P
	// for L from the length.
	for range 300 {
		n, off := hybridMin+r.IntN(256<<10), r.IntN(64)
		src := buf[off : off+n]
		if got, want := crc(src), crc32.Checksum(src, castagnoli); got != want {
			t.Fatalf("crc(%d bytes at +%d) = %08x, want %08x", n, off, got, want)
		}
	}
	// Errors anywhere change the checksum (a single flipped bit, always).
	src := buf[:64<<10]
	c := crc(src)
	for range 200 {
		i, b := r.IntN(len(src)), byte(1)<<r.IntN(8)
		src[i] ^= b
		if crc(src) == c {
			t.Fatalf("flipping bit %d of byte %d leaves the checksum", bits.TrailingZeros8(b), i)
		}
		src[i] ^= b
	}
}

// TestFoldConstants derives the folding constants of crc_amd64.s, and
// checks the derivation on CRC-32 (IEEE), whose constants hash/crc32 and
// Linux publish.
func TestFoldConstants(t *testing.T) {
	type consts struct {
		k2048, k512, k128 [2]uint64
		k64, poly, mu     uint64
	}
	derive := func(p uint64) consts {
		k := func(n int) uint64 { return uint64(bits.Reverse32(uint32(xnModP(n, p)))) << 1 }
		return consts{
			k2048: [2]uint64{k(2048 + 32), k(2048 - 32)},
			k512:  [2]uint64{k(512 + 32), k(512 - 32)},
			k128:  [2]uint64{k(128 + 32), k(128 - 32)},
			k64:   k(64),
			poly:  bits.Reverse64(p) >> 31,
			mu:    bits.Reverse64(x64DivP(p)) >> 31,
		}
	}
	ieee := derive(1<<32 | 0x04c11db7)
	if ieee.k512 != [2]uint64{0x154442bd4, 0x1c6e41596} || ieee.k128 != [2]uint64{0x1751997d0, 0x0ccaa009e} ||
		ieee.k64 != 0x163cd6124 || ieee.poly != 0x1db710641 || ieee.mu != 0x1f7011641 {
		t.Fatalf("IEEE constants %#x differ from hash/crc32's", ieee)
	}
	// The values in crc_amd64.s.
	want := consts{
		k2048: [2]uint64{0xdcb17aa4, 0xb9e02b86},
		k512:  [2]uint64{0x740eef02, 0x9e4addf8},
		k128:  [2]uint64{0xf20c0dfe, 0x14cd00bd6},
		k64:   0xdd45aab8, poly: 0x105ec76f1, mu: 0xdea713f1,
	}
	if got := derive(1<<32 | 0x1edc6f41); got != want {
		t.Fatalf("Castagnoli constants %#x, crc_amd64.s has %#x", got, want)
	}
}

// xnModP returns x^n mod P over GF(2); P has its x^32 term.
func xnModP(n int, p uint64) uint64 {
	r := uint64(1)
	for range n {
		r <<= 1
		if r&(1<<32) != 0 {
			r ^= p
		}
	}
	return r
}

// x64DivP returns the quotient floor(x^64 / P) over GF(2).
func x64DivP(p uint64) uint64 {
	var q uint64
	rem := [2]uint64{0, 1} // x^64: bit 64 is rem[1] bit 0
	bit := func(i int) uint64 { return rem[i/64] >> (i % 64) & 1 }
	for i := 64; i >= 32; i-- {
		if bit(i) == 0 {
			continue
		}
		q |= 1 << (i - 32)
		// Subtract P x^(i-32), a polynomial of degree i.
		lo := p << (i - 32)
		var hi uint64
		if i-32 > 31 {
			hi = p >> (64 - (i - 32))
		}
		rem[0] ^= lo
		rem[1] ^= hi
	}
	return q
}

func BenchmarkCRC(b *testing.B) {
	for _, n := range []int{64 << 10, 512 << 10, 1 << 20, 4 << 20} {
		src := make([]byte, n)
		for i := range src {
			src[i] = byte(i * 7)
		}
		dst := make([]byte, n)
		b.Run(fmt.Sprintf("size=%d/op=copy", n), func(b *testing.B) {
			b.SetBytes(int64(n))
			for b.Loop() {
				copy(dst, src)
			}
		})
		b.Run(fmt.Sprintf("size=%d/op=crc32", n), func(b *testing.B) {
			b.SetBytes(int64(n))
			for b.Loop() {
				crc32.Checksum(src, castagnoli)
			}
		})
		b.Run(fmt.Sprintf("size=%d/op=crc", n), func(b *testing.B) {
			b.SetBytes(int64(n))
			for b.Loop() {
				crc(src)
			}
		})
		b.Run(fmt.Sprintf("size=%d/op=copycrc", n), func(b *testing.B) {
			b.SetBytes(int64(n))
			for b.Loop() {
				copyCRC(dst, src)
			}
		})
	}
}
