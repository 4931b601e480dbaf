package data

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
)

const (
	// DefaultSyntheticTrain and DefaultSyntheticTest are the default sample
	// counts of a synthetic set.
	DefaultSyntheticTrain = 4096
	DefaultSyntheticTest  = 1024
	// DefaultSyntheticNoise is the default noise amplitude of a synthetic set.
	DefaultSyntheticNoise = 1.0

	maxSyntheticSample  = 1 << 24 // values per sample, and per dimension
	maxSyntheticValues  = 1 << 28 // values per split (1 GiB of float32)
	maxSyntheticClasses = 1 << 16

	// PCG stream tags of the synthetic generator (second seed word, top 16 bits).
	tagTemplate = 1 << 48
	tagTrain    = 2 << 48
	tagTest     = 3 << 48
)

// Synthetic returns a learnable data set of the given per-sample shape and
// number of classes, generated from opt.Seed. Class c has a fixed template t_c
// of values uniform in [0, 1); sample i has label i mod classes and values
// clamp(t_c + noise*u, 0, 1) with u uniform in [-1, 1). Sample i of a split
// depends only on (seed, split, i, shape, classes, noise), not on the sample
// counts, and its values are computed with integer and float32 arithmetic
// only, so they are the same on every platform.
func Synthetic(shape []int, classes int, opt Options) (*Set, error) {
	ntrain, ntest, noise := opt.Train, opt.Test, opt.Noise
	if ntrain == 0 {
		ntrain = DefaultSyntheticTrain
	}
	if ntest == 0 {
		ntest = DefaultSyntheticTest
	}
	if noise == 0 {
		noise = DefaultSyntheticNoise
	}
	if len(shape) == 0 {
		return nil, fmt.Errorf("data: synthetic: empty sample shape")
	}
	size := 1
	for _, d := range shape {
		if d <= 0 || d > maxSyntheticSample {
			return nil, fmt.Errorf("data: synthetic: bad sample shape %v", shape)
		}
		size *= d
		if size > maxSyntheticSample {
			return nil, fmt.Errorf("data: synthetic: sample shape %v has more than %d values", shape, maxSyntheticSample)
		}
	}
	switch {
	case classes < 2 || classes > maxSyntheticClasses:
		return nil, fmt.Errorf("data: synthetic: %d classes, want 2 to %d", classes, maxSyntheticClasses)
	case ntrain < 0 || ntest < 0:
		return nil, fmt.Errorf("data: synthetic: negative sample count (train %d, test %d)", ntrain, ntest)
	case ntrain > maxSyntheticValues/size || ntest > maxSyntheticValues/size:
		return nil, fmt.Errorf("data: synthetic: %d train / %d test samples of %d values exceed %d values per split", ntrain, ntest, size, maxSyntheticValues)
	case !(noise > 0 && noise <= 16):
		return nil, fmt.Errorf("data: synthetic: noise %v, want (0, 16]", noise)
	}

	var src rand.PCG
	templates := make([]float32, classes*size)
	for c := range classes {
		src.Seed(opt.Seed, tagTemplate|uint64(c))
		for j := range size {
			templates[c*size+j] = unit(&src)
		}
	}
	gen := func(n int, tag uint64) *Split {
		s := &Split{N: n, Shape: append([]int(nil), shape...), X: make([]float32, n*size), Y: make([]float32, n), Classes: classes}
		for i := range n {
			c := i % classes
			s.Y[i] = float32(c)
			src.Seed(opt.Seed, tag|uint64(i))
			t, x := templates[c*size:(c+1)*size], s.X[i*size:(i+1)*size]
			for j := range x {
				v := t[j] + float32(noise*(2*unit(&src)-1)) // the conversion forbids fusing into an FMA
				x[j] = min(max(v, 0), 1)
			}
		}
		return s
	}
	dims := make([]string, len(shape))
	for i, d := range shape {
		dims[i] = strconv.Itoa(d)
	}
	return &Set{
		Name:    fmt.Sprintf("synthetic:%s:%d", strings.Join(dims, "x"), classes),
		Train:   gen(ntrain, tagTrain),
		Test:    gen(ntest, tagTest),
		Classes: classes,
	}, nil
}

// unit returns a float32 uniform in [0, 1) from the top 24 bits of the next
// output, exactly.
func unit(src *rand.PCG) float32 {
	return float32(src.Uint64()>>40) * (1.0 / (1 << 24))
}
