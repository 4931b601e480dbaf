package data

import "math"

// Standardize rescales every channel (the last dimension) of both splits to
// zero mean and unit variance over the training split, as is usual for
// image data ((x - mean) / std). It returns the means and standard
// deviations used, so a pipeline node can apply the same transformation.
// Statistics are summed in float64 in sample order, so they are the same on
// every machine.
func (s *Set) Standardize() (mean, std []float64) {
	return s.StandardizeAxis(len(s.Train.Shape) - 1)
}

// StandardizeAxis is Standardize with the channels on the given axis of a
// sample ([C, H, W] images have them on axis 0).
func (s *Set) StandardizeAxis(axis int) (mean, std []float64) {
	return s.StandardizeInput(0, axis)
}

// StandardizeInput is StandardizeAxis for input k of the splits.
func (s *Set) StandardizeInput(k, axis int) (mean, std []float64) {
	train, test := s.Train.Inputs()[k], s.Test.Inputs()[k]
	shape := train.Shape
	c := shape[axis]
	inner := 1 // values of one channel that lie together
	for _, d := range shape[axis+1:] {
		inner *= d
	}
	ch := func(i int) int { return i / inner % c }
	mean, std = make([]float64, c), make([]float64, c)
	x := train.X
	n := float64(len(x) / c)
	for i, v := range x {
		mean[ch(i)] += float64(v)
	}
	for j := range mean {
		mean[j] /= n
	}
	for i, v := range x {
		d := float64(v) - mean[ch(i)]
		std[ch(i)] += float64(d * d)
	}
	for j := range std {
		std[j] = math.Sqrt(std[j] / n)
		if std[j] == 0 {
			std[j] = 1
		}
	}
	for _, xs := range [][]float32{train.X, test.X} {
		for i, v := range xs {
			j := ch(i)
			xs[i] = float32((float64(v) - mean[j]) / std[j])
		}
	}
	return mean, std
}
