package data

import "math"

// Standardize rescales every channel (the last dimension) of both splits to
// zero mean and unit variance over the training split, as is usual for
// image data ((x - mean) / std). It returns the means and standard
// deviations used, so a pipeline node can apply the same transformation.
// Statistics are summed in float64 in sample order, so they are the same on
// every machine.
func (s *Set) Standardize() (mean, std []float64) {
	shape := s.Train.Shape
	c := shape[len(shape)-1]
	mean, std = make([]float64, c), make([]float64, c)
	x := s.Train.X
	n := float64(len(x) / c)
	for i, v := range x {
		mean[i%c] += float64(v)
	}
	for j := range mean {
		mean[j] /= n
	}
	for i, v := range x {
		d := float64(v) - mean[i%c]
		std[i%c] += d * d
	}
	for j := range std {
		std[j] = math.Sqrt(std[j] / n)
		if std[j] == 0 {
			std[j] = 1
		}
	}
	for _, sp := range []*Split{s.Train, s.Test} {
		for i, v := range sp.X {
			j := i % c
			sp.X[i] = float32((float64(v) - mean[j]) / std[j])
		}
	}
	return mean, std
}
