package tensorio

import (
	"math/rand/v2"
	"testing"
)

const (
	link100Mbit = 100e6 / 8
	link10Gbit  = 10e9 / 8
)

func sampleData(kind int) []float32 {
	r := rand.New(rand.NewPCG(23, 24))
	s := make([]float32, 1<<18)
	fillData(r, s, kind)
	return s
}

// fixedSpeeds is a speed table like the ones measured on a 2-core EPYC
// with the Go sparse kernels (without AVX-512), so that this test does not
// depend on the machine or its load.
var fixedSpeeds = SpeedTable{
	CodecRaw:         {Encode: 6000e6, Decode: 9000e6},
	CodecSparse:      {Encode: 2200e6, Decode: 2600e6},
	CodecSparseHuff:  {Encode: 1400e6, Decode: 2100e6},
	CodecSparseZstd:  {Encode: 850e6, Decode: 1900e6},
	CodecShuffleZstd: {Encode: 180e6, Decode: 520e6},
	CodecS2:          {Encode: 450e6, Decode: 1400e6},
	CodecZstd:        {Encode: 175e6, Decode: 650e6},
	CodecBF16:        {Encode: 2800e6, Decode: 4000e6},
}

// tiesRaw reports whether c is lossless and estimated within 10% of raw:
// speeds are measured in a few milliseconds, and on a loaded machine (make
// test runs packages side by side) raw framing and AVX-512 sparse coding
// of incompressible data came out up to 7% apart, either way.
func tiesRaw(es []Estimate, c Codec) bool {
	var raw, got float64
	for _, e := range es {
		switch e.Codec {
		case CodecRaw:
			raw = e.SecondsPerByte
		case c:
			got = e.SecondsPerByte
		}
	}
	return c.Lossless() && raw > 0 && got > 0 && got >= 0.9*raw
}

func TestChoose(t *testing.T) {
	gauss, relu := sampleData(fillGauss), sampleData(fillReLU)
	for name, st := range map[string]SpeedTable{"fixed": fixedSpeeds, "measured": DefaultSpeeds()} {
		if c := st.Choose(gauss, link10Gbit); c != CodecRaw && (name == "fixed" || !tiesRaw(st.Estimates(gauss, link10Gbit), c)) {
			t.Errorf("%s speeds: Gaussian data on 10 Gbit/s: chose %v, want raw (%+v)", name, c, st.Estimates(gauss, link10Gbit))
		}
		c := st.Choose(relu, link100Mbit)
		if c == CodecRaw || c == CodecBF16 || !c.Lossless() {
			t.Errorf("%s speeds: half-zero data on 100 Mbit/s: chose %v, want a lossless compressing codec", name, c)
		}
		for _, e := range st.Estimates(relu, link100Mbit) {
			// (With measured speeds the pick depends on the machine and
			// its load; under the race detector Go code slows down far
			// more than s2's assembly. Any compressing codec will do.)
			if e.Codec == c && e.Ratio >= 0.9 {
				t.Errorf("%s speeds: chose %v with ratio %.3f, want a compressing codec", name, c, e.Ratio)
			}
		}
	}
	// With the fixed table, ReLU data goes as sparse+huff on a slow link
	// (the best ratio among the fast codecs) and raw at 10 Gbit/s, where
	// even sparse's 2 GB/s costs more than it saves (0.45 + 0.42 + 0.38
	// ns/byte against 0.17 + 0.8 + 0.11).
	if c := fixedSpeeds.Choose(relu, link100Mbit); c != CodecSparseHuff {
		t.Errorf("fixed speeds, ReLU, 100 Mbit/s: %v, want sparse+huff (%+v)", c, fixedSpeeds.Estimates(relu, link100Mbit))
	}
	if c := fixedSpeeds.Choose(relu, link10Gbit); c != CodecRaw {
		t.Errorf("fixed speeds, ReLU, 10 Gbit/s: %v, want raw (%+v)", c, fixedSpeeds.Estimates(relu, link10Gbit))
	}
	if c := (SpeedTable{}).Choose(relu, link100Mbit); c != CodecRaw {
		t.Errorf("empty table: %v, want raw", c)
	}
	if c := DefaultSpeeds().Choose(nil, link100Mbit); c == CodecBF16 {
		t.Errorf("empty sample: %v", c)
	}
}

func TestSubsample(t *testing.T) {
	s := make([]float32, 1<<20)
	for i := range s {
		s[i] = float32(i)
	}
	sub := subsample(s)
	if len(sub) != sampleLimit || sub[0] != 0 || sub[len(sub)-1] != float32(len(s)-1) {
		t.Fatalf("subsample: %d elements, first %v, last %v", len(sub), sub[0], sub[len(sub)-1])
	}
}
