// Package openblas is nn's door to OpenBLAS's single-precision matrix
// product (cblas_sgemm) and its thread setting, when built with the tag
// openblas and cgo against libopenblas (Debian: libopenblas-dev). Without
// the tag, or without cgo, Available is false and the functions panic.
//
// The cgo code lives here rather than in nn because a package that uses
// cgo cannot hold Go assembly (the go command assembles its .s files with
// the C compiler), and nn's kernels (the optimizers') are written in Go
// assembly.
//
// # Concurrency
//
// Sgemm may be called from many goroutines at once; OpenBLAS keeps no
// pointer into Go memory after a call returns. SetThreads sets a
// process-wide OpenBLAS setting.
package openblas
