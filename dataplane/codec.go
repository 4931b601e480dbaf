package dataplane

import (
	"math"
	"sync/atomic"
	"time"

	"github.com/ppnode/ppnode/nn"
	"github.com/ppnode/ppnode/tensorio"
)

// DefaultRate is the link speed an automatic codec assumes until told
// (1 Gbit/s, as balance.DefaultLink).
const DefaultRate = 125e6

// Re-sampling: a kind's codec is chosen again from a fresh sample once
// resampleFrames frames have gone since the last, and at least
// resampleFactor times as long as that sampling took, which bounds its
// cost to 1/resampleFactor of the link's time per kind (a stage's links
// carry up to four kinds between them: 0.2% of its time in all).
const (
	resampleFrames = 64
	resampleFactor = 2000
)

// KindStats is what a link sent of one kind of tensor.
type KindStats struct {
	Frames int64 `json:"frames"`
	// RawBytes is what raw frames would have put on the wire (tags and
	// headers included); WireBytes is what was.
	RawBytes  int64 `json:"raw_bytes"`
	WireBytes int64 `json:"wire_bytes"`
	// EncodeNs is the time spent encoding and checksumming, WriteNs the
	// time spent in the connection's writes (waiting for the link once
	// the socket's buffer is full), SampleNs the time spent choosing
	// codecs.
	EncodeNs int64 `json:"encode_ns"`
	WriteNs  int64 `json:"write_ns"`
	SampleNs int64 `json:"sample_ns,omitempty"`
	// Codec is the codec of the last frame.
	Codec tensorio.Codec `json:"codec"`
}

// Stats is what a link sent, by kind (index: Kind; 0 unused).
type Stats [KindSum + 1]KindStats

// Sub returns s - o, counter by counter (Codec is s's).
func (s Stats) Sub(o Stats) Stats {
	for k := range s {
		a, b := &s[k], o[k]
		a.Frames -= b.Frames
		a.RawBytes -= b.RawBytes
		a.WireBytes -= b.WireBytes
		a.EncodeNs -= b.EncodeNs
		a.WriteNs -= b.WriteNs
		a.SampleNs -= b.SampleNs
	}
	return s
}

// chooser picks the codec of each kind a link sends (see Options).
type chooser struct {
	fixed  tensorio.Codec
	auto   bool
	lossy  tensorio.Codec
	speeds tensorio.SpeedTable
	rate   atomic.Uint64 // float64 bits: the link's bytes per second
	kinds  [KindSum + 1]kindChoice
}

// kindChoice is the choice for one kind: the estimates of the last sample
// and when and at what cost it was taken.
type kindChoice struct {
	est       []tensorio.Estimate
	frames    int
	sampledAt time.Time
	cost      time.Duration
}

func newChooser(o Options) *chooser {
	c := &chooser{fixed: o.Codec, auto: o.Auto, lossy: o.Lossy, speeds: o.Speeds}
	if c.lossy.Lossless() {
		c.lossy = tensorio.CodecRaw // lossless codecs are Auto's or Codec's
	}
	c.setRate(o.Rate)
	return c
}

func (c *chooser) setRate(bytesPerSec float64) {
	if !(bytesPerSec > 0) || math.IsInf(bytesPerSec, 0) {
		bytesPerSec = DefaultRate
	}
	c.rate.Store(math.Float64bits(bytesPerSec))
}

func (c *chooser) linkRate() float64 { return math.Float64frombits(c.rate.Load()) }

// codec returns the codec for t of kind k, sampling t first if due, and
// the time the sampling took.
func (c *chooser) codec(k Kind, t *nn.Tensor, now func() time.Time) (tensorio.Codec, time.Duration) {
	if c.lossy != tensorio.CodecRaw && (k == KindActivation || k == KindGradient) {
		return c.lossy, 0
	}
	if !c.auto {
		return c.fixed, 0
	}
	kc := &c.kinds[k]
	kc.frames++
	var took time.Duration
	if kc.est == nil || kc.frames >= resampleFrames && now().Sub(kc.sampledAt) >= resampleFactor*kc.cost {
		t0 := now()
		speeds := c.speeds
		if speeds == nil {
			speeds = tensorio.DefaultSpeeds()
		}
		kc.est = speeds.Estimates(nn.F32(t), c.linkRate())
		kc.sampledAt = now()
		kc.cost = kc.sampledAt.Sub(t0)
		kc.frames = 0
		took = kc.cost
	}
	return tensorio.Best(kc.est, c.linkRate()), took
}
