package sgemm

import (
	"syscall"
	"time"
)

// threadCPU is the CPU time of the calling OS thread (lock it first).
func threadCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(1 /* RUSAGE_THREAD */, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
