package tensorio

import (
	"math"
	"math/rand/v2"
	"sync"
	"time"
)

// CodecSpeed is a codec's throughput in bytes of raw float32 data per
// second.
type CodecSpeed struct {
	Encode, Decode float64
}

// SpeedTable gives each codec's speed. Codecs missing from it are not
// considered by Choose.
type SpeedTable map[Codec]CodecSpeed

// Estimate is the predicted cost of sending a tensor like a sample with
// one codec.
type Estimate struct {
	Codec Codec
	// Ratio is encoded bytes per raw byte (below 1 compresses).
	Ratio float64
	// SecondsPerByte is encode + transfer + decode time per raw byte.
	SecondsPerByte float64
	// Fixed is its encode + decode time per raw byte, the part that does
	// not depend on the link.
	Fixed float64
}

// At is the estimate's time per raw byte over a link of the given speed.
func (e Estimate) At(linkBytesPerSec float64) float64 { return e.Fixed + e.Ratio/linkBytesPerSec }

// Best returns the lossless codec of est with the least time per raw byte
// over a link of the given speed; raw when est has none.
func Best(est []Estimate, linkBytesPerSec float64) Codec {
	best, bestCost := CodecRaw, math.Inf(1)
	for _, e := range est {
		if c := e.At(linkBytesPerSec); e.Codec.Lossless() && c < bestCost {
			best, bestCost = e.Codec, c
		}
	}
	return best
}

// sampleLimit bounds the elements of a sample that Choose encodes.
const sampleLimit = 1 << 16

// Choose returns the lossless codec that minimises encode + transfer +
// decode time for tensors like sample over a link of the given speed, by
// the table's speeds (see Estimates; DefaultSpeeds are this machine's);
// raw when the table is empty. A lossy codec is never chosen: lossy
// compression is the job's decision.
func (st SpeedTable) Choose(sample []float32, linkBytesPerSec float64) Codec {
	return Best(st.Estimates(sample, linkBytesPerSec), linkBytesPerSec)
}

// Estimates predicts, for every codec of the table, the compression ratio
// of sample (measured by encoding it, or at most 64 Ki elements of it
// taken in 16 evenly spaced runs) and the time per raw byte:
// 1/encode speed + ratio/link speed + 1/decode speed. Results are in
// Codecs() order.
func (st SpeedTable) Estimates(sample []float32, linkBytesPerSec float64) []Estimate {
	sample = subsample(sample)
	s := encPool.Get().(*scratch)
	defer encPool.Put(s)
	var buf []byte
	var out []Estimate
	for _, c := range Codecs() {
		sp, ok := st[c]
		if !ok || sp.Encode <= 0 || sp.Decode <= 0 {
			continue
		}
		ratio := 1.0
		if len(sample) > 0 {
			buf = appendPayload(buf[:0], sample, c, s)
			ratio = float64(len(buf)) / float64(4*len(sample))
		}
		fixed := 1/sp.Encode + 1/sp.Decode
		out = append(out, Estimate{
			Codec:          c,
			Ratio:          ratio,
			SecondsPerByte: fixed + ratio/linkBytesPerSec,
			Fixed:          fixed,
		})
	}
	return out
}

// subsample returns s, or 16 evenly spaced runs of s totalling
// sampleLimit elements when s is longer.
func subsample(s []float32) []float32 {
	if len(s) <= sampleLimit {
		return s
	}
	const runs = 16
	run := sampleLimit / runs
	out := make([]float32, 0, sampleLimit)
	for i := range runs {
		at := i * (len(s) - run) / (runs - 1)
		out = append(out, s[at:at+run]...)
	}
	return out
}

// DefaultSpeeds returns the speeds of every codec on this machine,
// measured by MeasureSpeeds on the first call.
func DefaultSpeeds() SpeedTable { return defaultSpeeds() }

var defaultSpeeds = sync.OnceValue(MeasureSpeeds)

// MeasureSpeeds times every codec encoding and decoding a 1 MiB tensor of
// ReLU-like activations (half zeros), checksum included, taking the best
// of several runs. It takes a few tens of milliseconds.
func MeasureSpeeds() SpeedTable {
	r := rand.New(rand.NewPCG(1, 2))
	src := make([]float32, 1<<18)
	for i := range src {
		src[i] = max(float32(r.NormFloat64()), 0)
	}
	dst := make([]float32, len(src))
	var es, ds scratch
	var buf []byte
	st := SpeedTable{}
	for _, c := range Codecs() {
		enc, dec := time.Duration(math.MaxInt64), time.Duration(math.MaxInt64)
		for range 3 {
			t0 := time.Now()
			encodeChecked(&buf, src, c, &es)
			t1 := time.Now()
			_ = decodeChecked(dst, buf, c, &ds)
			t2 := time.Now()
			enc, dec = min(enc, t1.Sub(t0)), min(dec, t2.Sub(t1))
		}
		bytes := float64(4 * len(src))
		st[c] = CodecSpeed{
			Encode: bytes / max(enc.Seconds(), 1e-9),
			Decode: bytes / max(dec.Seconds(), 1e-9),
		}
	}
	return st
}

// encodeChecked encodes src into *buf and checksums it, as AppendFrame
// does (raw frames are copied and checksummed in one pass).
func encodeChecked(buf *[]byte, src []float32, c Codec, s *scratch) uint32 {
	if view := f32View(src); c == CodecRaw && view != nil {
		*buf = resize(*buf, len(view))
		return copyCRC(*buf, view)
	}
	*buf = appendPayload((*buf)[:0], src, c, s)
	return crc(*buf)
}

// decodeChecked verifies and decodes payload into dst, as DecodeFrame
// does.
func decodeChecked(dst []float32, payload []byte, c Codec, s *scratch) error {
	if view := f32View(dst); c == CodecRaw && view != nil && len(view) == len(payload) {
		copyCRC(view, payload)
		return nil
	}
	crc(payload)
	return decodePayload(dst, payload, c, s)
}
