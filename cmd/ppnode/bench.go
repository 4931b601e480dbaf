package main

import (
	"flag"
	"fmt"
	"io"
	"runtime"
	"time"

	"github.com/ppnode/ppnode/nn"
)

func runBench(args []string, stdout, stderr io.Writer) error {
	const synopsis = "gemm [--size N] [--threads N] [--time D]"
	if len(args) > 0 && (args[0] == "-h" || args[0] == "-help" || args[0] == "--help" || args[0] == "help") {
		fmt.Fprintf(stdout, "usage: ppnode bench %s\n\nRun 'ppnode bench gemm --help' for its flags.\n", synopsis)
		return flag.ErrHelp
	}
	if len(args) == 0 || args[0] != "gemm" {
		return usagef("want a kernel to measure: ppnode bench %s", synopsis)
	}
	fs := newFlagSet("bench", synopsis)
	size := fs.Int("size", 1024, "matrix size N (N×N times N×N)")
	threads := fs.Int("threads", 0, "threads (default: all CPUs)")
	dur := fs.Duration("time", time.Second, "time per backend")
	if err := parseFlags(fs, args[1:], stdout); err != nil {
		return err
	}
	if *size < 1 || *size > 16384 {
		return usagef("--size must be in [1, 16384]")
	}
	t := *threads
	if t <= 0 {
		t = runtime.NumCPU()
	}
	runtime.GOMAXPROCS(max(t, runtime.GOMAXPROCS(0)))
	n := *size
	a, b, c := make([]float32, n*n), make([]float32, n*n), make([]float32, n*n)
	for i := range a {
		a[i] = float32(i%7) - 3
		b[i] = float32(i%5) - 2
	}
	for _, name := range nn.Backends() {
		be, err := nn.NewBackend(name, t, false)
		if err != nil {
			return err
		}
		be.Sgemm(false, false, n, n, n, 1, a, n, b, n, 0, c, n) // warm up
		runs := 0
		start := time.Now()
		for time.Since(start) < *dur || runs < 2 {
			be.Sgemm(false, false, n, n, n, 1, a, n, b, n, 0, c, n)
			runs++
		}
		sec := time.Since(start).Seconds()
		gflops := 2 * float64(n) * float64(n) * float64(n) * float64(runs) / sec / 1e9
		fmt.Fprintf(stdout, "%-10s threads=%d  n=%d  %7.1f GFLOP/s  (deterministic: %v)\n", name, t, n, gflops, be.Deterministic())
	}
	return nil
}
