//go:build !amd64 || purego

package nn

// Without the assembly kernels (other architectures and purego) the loops
// in optim.go do all the work.

func sgdVector(w, g, b []float32, k *sgdCoef) int { return 0 }

func adamVector(w, g, m, v []float32, k *adamCoef) int { return 0 }
