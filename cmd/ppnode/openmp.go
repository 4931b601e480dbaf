package main

import (
	"os"
	"syscall"

	"github.com/ppnode/ppnode/nn"
)

// spinCount is how long OpenMP's idle threads spin before they sleep
// (GOMP_SPINCOUNT, in iterations of a wait loop). libgomp's default,
// 300000, spends about 9 ms of CPU after every pass of a stage, taken from
// the data plane and from other processes; 30000 about 2.5 ms, with passes
// as fast (BENCHMARKS.md, BenchmarkTeamIdleSpin).
const spinCount = "30000"

// tuneOpenMP re-executes the program with GOMP_SPINCOUNT set when oneDNN
// is compiled in and the user set neither it nor OMP_WAIT_POLICY: libgomp
// reads them once, as it loads, before main runs. If it cannot, the
// program runs on with libgomp's defaults.
func tuneOpenMP() {
	_, spin := os.LookupEnv("GOMP_SPINCOUNT")
	_, policy := os.LookupEnv("OMP_WAIT_POLICY")
	if !nn.OneDNN || spin || policy {
		return
	}
	exe, err := os.Executable()
	if err != nil {
		return
	}
	env := append(os.Environ(), "GOMP_SPINCOUNT="+spinCount)
	syscall.Exec(exe, os.Args, env) // returns only on failure
}
