package dataplane

import (
	"bufio"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/ppnode/ppnode/tensorio"
)

// A keyed link without TLS seals what each end sends into records:
//
//	length u32 (1..maxSealed, little-endian) | bytes | tag (16 bytes)
//
// The tag is AES-128-GMAC (GCM with nothing to encrypt) of the bytes under
// the sending direction's key, with nonce (record number u64, length u32):
// a record altered, dropped, replayed, reordered or moved to another link
// or direction fails its check, and the receiver hands on only bytes that
// passed. GMAC because it is the fastest keyed MAC the standard library
// has (carry-less multiplication in hardware); the records leave the bytes
// readable, which only TLS (--encrypt-data) prevents.
const (
	maxSealed = 1 << 20
	sealTag   = 16
	sealHdr   = 4
)

// frameKeysLabel starts every derivation of a link's frame keys; it is
// not a prefix of a proof's input, so no proof sent in the clear is a key.
const frameKeysLabel = "ppnode/dataplane frame keys"

// frameKeys derives the link's two frame keys (dialer to listener, then
// listener to dialer) from the cluster key and the handshake: both nonces
// and the dialer's encoded Hello.
func frameKeys(key, nd, nl, hello []byte) (toListener, toDialer cipher.AEAD) {
	derive := func(dir byte) cipher.AEAD {
		m := hmac.New(sha256.New, key)
		m.Write([]byte(frameKeysLabel))
		m.Write([]byte{dir})
		m.Write(nd)
		m.Write(nl)
		m.Write(hello)
		b, err := aes.NewCipher(m.Sum(nil)[:16])
		if err != nil {
			panic(err) // 16 bytes is always an AES key
		}
		g, err := cipher.NewGCM(b)
		if err != nil {
			panic(err) // AES is always a GCM block cipher
		}
		return g
	}
	return derive('l'), derive('d')
}

func sealNonce(n *[12]byte, seq uint64, length int) []byte {
	binary.LittleEndian.PutUint64(n[:8], seq)
	binary.LittleEndian.PutUint32(n[8:], uint32(length))
	return n[:]
}

// sealer writes what it is given as sealed records to w.
type sealer struct {
	w     *timedWriter
	aead  cipher.AEAD
	seq   uint64
	nonce [12]byte
	hdr   [sealHdr]byte
	tag   [sealTag]byte
}

func (s *sealer) Write(p []byte) (int, error) {
	n := 0
	for len(p) > 0 {
		k := min(len(p), maxSealed)
		binary.LittleEndian.PutUint32(s.hdr[:], uint32(k))
		s.aead.Seal(s.tag[:0], sealNonce(&s.nonce, s.seq, k), nil, p[:k])
		s.seq++
		if err := s.w.writeVec(s.hdr[:], p[:k], s.tag[:]); err != nil {
			return n, err
		}
		n += k
		p = p[k:]
	}
	return n, nil
}

// opener reads sealed records from r and returns their bytes once checked.
type opener struct {
	r       *bufio.Reader
	aead    cipher.AEAD
	seq     uint64
	nonce   [12]byte
	tag     [sealTag]byte
	buf     []byte // a record read whole because Read's buffer was shorter
	pending []byte // checked bytes of buf not yet returned
}

func newOpener(r io.Reader, aead cipher.AEAD) *opener {
	return &opener{r: bufio.NewReaderSize(r, ioBufSize), aead: aead}
}

func (o *opener) Read(p []byte) (int, error) {
	if len(o.pending) > 0 {
		n := copy(p, o.pending)
		o.pending = o.pending[n:]
		return n, nil
	}
	var hdr [sealHdr]byte
	if n, err := io.ReadFull(o.r, hdr[:]); err != nil {
		if err == io.EOF && n == 0 {
			return 0, io.EOF
		}
		return 0, o.short(err)
	}
	k := int(binary.LittleEndian.Uint32(hdr[:]))
	if k == 0 || k > maxSealed {
		return 0, fmt.Errorf("sealed record of %d bytes, want 1 to %d: %w", k, maxSealed, tensorio.ErrCorrupt)
	}
	dst := p
	if len(p) < k {
		if cap(o.buf) < k {
			o.buf = make([]byte, k)
		}
		dst = o.buf
	}
	dst = dst[:k]
	if _, err := io.ReadFull(o.r, dst); err != nil {
		return 0, o.short(err)
	}
	if _, err := io.ReadFull(o.r, o.tag[:]); err != nil {
		return 0, o.short(err)
	}
	if _, err := o.aead.Open(nil, sealNonce(&o.nonce, o.seq, k), o.tag[:], dst); err != nil {
		return 0, fmt.Errorf("record %d fails its authentication (changed, dropped or replayed on the path): %w", o.seq, tensorio.ErrCorrupt)
	}
	o.seq++
	if len(p) < k {
		n := copy(p, dst)
		o.pending = dst[n:]
		return n, nil
	}
	return k, nil
}

// short reports a stream that ends inside a record.
func (o *opener) short(err error) error {
	if err == io.EOF || err == io.ErrUnexpectedEOF {
		return fmt.Errorf("stream ends inside sealed record %d: %w (%w)", o.seq, tensorio.ErrCorrupt, io.ErrUnexpectedEOF)
	}
	return err
}

// writeVec writes bufs as one write where the connection gathers them
// (a TCP connection's writev), counted and timed like Write.
func (t *timedWriter) writeVec(bufs ...[]byte) error {
	var size int64
	for _, b := range bufs {
		size += int64(len(b))
	}
	nb := net.Buffers(bufs)
	t0 := time.Now()
	n, err := nb.WriteTo(t.w)
	t.ns += int64(time.Since(t0))
	t.n += n
	if err == nil && n != size {
		err = io.ErrShortWrite
	}
	return err
}
