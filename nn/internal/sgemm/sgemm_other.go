//go:build !(amd64 || arm64) || purego

package sgemm

func cpuKernels() []*Kernel { return nil }
