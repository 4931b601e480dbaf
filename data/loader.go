package data

import (
	"fmt"
	"math/bits"
	"math/rand/v2"

	"github.com/ppnode/ppnode/nn"
)

// Loader visits a split in the deterministic order described in the package
// doc: per epoch a permutation that is a pure function of (seed, epoch), cut
// into mini-batches of B samples and those into M micro-batches.
//
// A Loader caches the permutation of the last epoch asked for, so calls
// within one epoch do not recompute it and Micro does not allocate. It is not
// safe for concurrent use; give each goroutine its own Loader (they agree on
// every batch).
//
// Epoch, step and micro-batch indices out of range are programmer errors and
// panic, like an index out of range.
type Loader struct {
	split        *Split
	seed         uint64
	batch, micro int

	src   rand.PCG
	epoch int     // the epoch perm belongs to; -1 before the first
	perm  []int32 // the permutation of epoch

	scratch nn.Batch // Micro's
}

// NewLoader returns a loader over s with mini-batches of batch samples, each
// cut into micro micro-batches. It checks s, and that 1 <= micro <= batch <= s.N.
func NewLoader(s *Split, seed uint64, batch, micro int) (*Loader, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	switch {
	case batch < 1 || batch > s.N:
		return nil, fmt.Errorf("data: batch size %d, want 1 to %d (the split's samples)", batch, s.N)
	case micro < 1 || micro > batch:
		return nil, fmt.Errorf("data: %d micro-batches, want 1 to %d (the batch size)", micro, batch)
	case s.N > 1<<31-1:
		return nil, fmt.Errorf("data: split of %d samples is too large", s.N)
	}
	return &Loader{split: s, seed: seed, batch: batch, micro: micro, epoch: -1, perm: make([]int32, s.N)}, nil
}

// Split returns the split the loader visits.
func (l *Loader) Split() *Split { return l.split }

// BatchSize is B, the samples in one mini-batch.
func (l *Loader) BatchSize() int { return l.batch }

// MicroBatches is M, the micro-batches of one mini-batch.
func (l *Loader) MicroBatches() int { return l.micro }

// StepsPerEpoch is N/B: the last incomplete mini-batch of an epoch is dropped.
func (l *Loader) StepsPerEpoch() int { return l.split.N / l.batch }

// MicroSize is the number of samples in micro-batch m: B/M+1 for the first
// B%M micro-batches, B/M for the others.
func (l *Loader) MicroSize(m int) int {
	l.checkMicro(m)
	n := l.batch / l.micro
	if m < l.batch%l.micro {
		n++
	}
	return n
}

// microStart is the offset of micro-batch m inside a mini-batch.
func (l *Loader) microStart(m int) int {
	return m*(l.batch/l.micro) + min(m, l.batch%l.micro)
}

// Indices returns the sample indices of micro-batch m of mini-batch step of
// epoch, or of the whole mini-batch if m is -1. The slice aliases the
// loader's cached permutation: do not modify it; it is valid until a call
// for another epoch.
func (l *Loader) Indices(epoch, step, m int) []int32 {
	if step < 0 || step >= l.StepsPerEpoch() {
		panic(fmt.Sprintf("data: step %d out of range [0, %d)", step, l.StepsPerEpoch()))
	}
	perm := l.permutation(epoch)[step*l.batch : (step+1)*l.batch]
	if m == -1 {
		return perm
	}
	start := l.microStart(m)
	return perm[start : start+l.MicroSize(m)]
}

// Fill fills b with micro-batch m of mini-batch step of epoch: b.X holds
// one tensor per input ([MicroSize(m), shape...]) and b.Y the labels. Its
// tensors are reused when they fit and reallocated otherwise, so a caller
// that keeps one Batch per micro-batch index (or uses an M that divides B)
// allocates nothing after the first step.
func (l *Loader) Fill(epoch, step, m int, b *nn.Batch) {
	l.checkMicro(m)
	l.split.Gather(l.Indices(epoch, step, m), b)
}

// Micro is Fill for a split of one input: it fills x and y (reused when
// they fit) and returns them.
func (l *Loader) Micro(epoch, step, m int, x *nn.Tensor, y []float32) (*nn.Tensor, []float32) {
	b := &l.scratch
	b.X, b.Y = append(b.X[:0], x), y
	l.Fill(epoch, step, m, b)
	return b.X[0], b.Y
}

// Batch returns micro-batch micro of mini-batch step of epoch in new buffers;
// micro -1 returns the whole mini-batch (the micro-batches in order).
func (l *Loader) Batch(epoch, step, micro int) (*nn.Tensor, []float32) {
	if micro != -1 {
		l.checkMicro(micro)
	}
	var b nn.Batch
	l.split.Gather(l.Indices(epoch, step, micro), &b)
	return b.X[0], b.Y
}

func (l *Loader) checkMicro(m int) {
	if m < 0 || m >= l.micro {
		panic(fmt.Sprintf("data: micro-batch %d out of range [0, %d)", m, l.micro))
	}
}

// Perm returns the permutation of epoch: a copy, for tests and tools.
func (l *Loader) Perm(epoch int) []int32 {
	return append([]int32(nil), l.permutation(epoch)...)
}

// permutation returns the cached permutation of epoch, computing it if the
// cache holds another epoch: a Fisher-Yates shuffle of the identity driven by
// PCG(seed, epoch).
func (l *Loader) permutation(epoch int) []int32 {
	if epoch < 0 {
		panic(fmt.Sprintf("data: negative epoch %d", epoch))
	}
	if epoch == l.epoch {
		return l.perm
	}
	p := l.perm
	for i := range p {
		p[i] = int32(i)
	}
	l.src.Seed(l.seed, uint64(epoch))
	for i := len(p) - 1; i > 0; i-- {
		j := uintn(&l.src, uint64(i+1))
		p[i], p[j] = p[j], p[i]
	}
	l.epoch = epoch
	return p
}

// uintn returns a uniform integer in [0, n), n > 0, by Lemire's
// multiply-shift with rejection ("Fast Random Integer Generation in an
// Interval", 2019). Spelled out here so that the order does not depend on
// how a Go release implements rand.Rand.IntN.
func uintn(src *rand.PCG, n uint64) uint64 {
	hi, lo := bits.Mul64(src.Uint64(), n)
	if lo < n {
		thresh := -n % n
		for lo < thresh {
			hi, lo = bits.Mul64(src.Uint64(), n)
		}
	}
	return hi
}
