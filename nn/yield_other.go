//go:build !linux

package nn

// osYield is a no-op where sched_yield is not at hand.
func osYield() {}
