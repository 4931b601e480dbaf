package cluster

import (
	"encoding/json"
	"fmt"
	"math"
	"net"
)

// MaxMetaSize is the largest encoded metadata a node may gossip. It is
// memberlist's MetaMaxSize: memberlist panics on anything longer, so
// [EncodeMeta] refuses it with [ErrMetaTooLarge] first.
const MaxMetaSize = 512

// metaFormat is the first byte of encoded metadata.
const metaFormat = 1

// leavingMark is what the leaving flag adds to encoded metadata at most.
// EncodeMeta keeps room for it, so Leave can always set it.
const leavingMark = len(`,"l":true`)

// Meta is what a node tells the cluster about itself. It travels in every
// alive message, so it must stay small: encoded, at most [MaxMetaSize]
// bytes less 9 kept for the leaving mark (about 400 bytes of strings once
// the fixed fields are counted).
type Meta struct {
	// ActorAddr is the host:port of the node's actor system, where
	// other nodes send control messages; empty if it has none yet.
	ActorAddr string
	// Version is the ppnode version the node runs.
	Version string
	// Profile is the node's measured speed and size.
	Profile Profile
	// Tags are free-form labels (for example the HTTP status address).
	// They count against the size limit.
	Tags map[string]string
}

// Profile summarises what a node measured about itself at start. The
// balancer scales per-layer timings by GEMMGFLOPS and keeps stages within
// MemoryBytes.
type Profile struct {
	GEMMGFLOPS  float64 // float32 GEMM throughput, GFLOP/s
	MemoryBytes uint64  // memory available for training, bytes
	Threads     int     // threads the node computes with
}

// wireMeta is Meta as it is encoded, with one-letter keys to save bytes.
type wireMeta struct {
	ActorAddr string            `json:"a,omitempty"`
	Version   string            `json:"v,omitempty"`
	GFLOPS    float64           `json:"g,omitempty"`
	Memory    uint64            `json:"m,omitempty"`
	Threads   int               `json:"t,omitempty"`
	Tags      map[string]string `json:"x,omitempty"`
	Leaving   bool              `json:"l,omitempty"` // set by Leave
}

// EncodeMeta encodes m for gossip:
//
//	+--------+-------------------------------------------------------+
//	| format | JSON object                                           |
//	|   1    | {"a":actor addr,"v":version,"g":GFLOP/s,"m":memory,   |
//	|        |  "t":threads,"x":{tags},"l":leaving}                  |
//	|        |  (empty fields are omitted)                           |
//	+--------+-------------------------------------------------------+
//	0        1                                          at most 512 bytes
//
// "l":true is set only while a node leaves (see [Node.Leave]). Decoders
// ignore keys they do not know, so later versions may add some.
// EncodeMeta returns an error wrapping [ErrMetaTooLarge] if the result
// would leave less than 9 bytes for the leaving mark within
// [MaxMetaSize], and one wrapping [ErrBadMeta] if m is not valid (see
// [Meta] and [Profile]).
func EncodeMeta(m Meta) ([]byte, error) {
	return encodeMeta(m, false)
}

func encodeMeta(m Meta, leaving bool) ([]byte, error) {
	if err := m.validate(); err != nil {
		return nil, err
	}
	w := wireMeta{
		ActorAddr: m.ActorAddr,
		Version:   m.Version,
		GFLOPS:    m.Profile.GEMMGFLOPS,
		Memory:    m.Profile.MemoryBytes,
		Threads:   m.Profile.Threads,
		Tags:      m.Tags,
		Leaving:   leaving,
	}
	js, err := json.Marshal(w)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadMeta, err)
	}
	limit := MaxMetaSize
	if !leaving {
		limit -= leavingMark
	}
	if n := 1 + len(js); n > limit {
		return nil, fmt.Errorf("%w: %d bytes encoded, limit %d", ErrMetaTooLarge, n, limit)
	}
	return append([]byte{metaFormat}, js...), nil
}

// decodeMeta decodes metadata written by [EncodeMeta], and its leaving
// mark. Metadata comes from the network: anything malformed returns an
// error wrapping [ErrBadMeta].
func decodeMeta(b []byte) (Meta, bool, error) {
	switch {
	case len(b) == 0:
		return Meta{}, false, fmt.Errorf("%w: empty (node is not a ppnode node?)", ErrBadMeta)
	case len(b) > MaxMetaSize:
		return Meta{}, false, fmt.Errorf("%w: %d bytes, limit %d", ErrBadMeta, len(b), MaxMetaSize)
	case b[0] != metaFormat:
		return Meta{}, false, fmt.Errorf("%w: unknown format %d", ErrBadMeta, b[0])
	}
	var w wireMeta
	if err := json.Unmarshal(b[1:], &w); err != nil {
		return Meta{}, false, fmt.Errorf("%w: %v", ErrBadMeta, err)
	}
	m := Meta{
		ActorAddr: w.ActorAddr,
		Version:   w.Version,
		Profile:   Profile{GEMMGFLOPS: w.GFLOPS, MemoryBytes: w.Memory, Threads: w.Threads},
		Tags:      w.Tags,
	}
	if len(m.Tags) == 0 {
		m.Tags = nil
	}
	if err := m.validate(); err != nil {
		return Meta{}, false, err
	}
	return m, w.Leaving, nil
}

func (m Meta) validate() error {
	if m.ActorAddr != "" {
		if _, _, err := net.SplitHostPort(m.ActorAddr); err != nil {
			return fmt.Errorf("%w: actor address %q: %v", ErrBadMeta, m.ActorAddr, err)
		}
	}
	p := m.Profile
	if math.IsNaN(p.GEMMGFLOPS) || math.IsInf(p.GEMMGFLOPS, 0) || p.GEMMGFLOPS < 0 {
		return fmt.Errorf("%w: GEMM GFLOP/s %v", ErrBadMeta, p.GEMMGFLOPS)
	}
	if p.Threads < 0 {
		return fmt.Errorf("%w: threads %d", ErrBadMeta, p.Threads)
	}
	return nil
}
