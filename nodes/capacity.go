package nodes

import (
	"sync"
	"time"

	"github.com/ppnode/ppnode/cgroup"
)

// A node in a container, or in a cgroup of its own, may have a CPU limit
// (a CFS quota: so many microseconds of CPU per period). Under it, compute
// runs at full speed until the period's quota is used up and then not at
// all: a stage that idles part of each step looks as fast as an
// unlimited node when timed, though it can sustain only the limit. The
// coordinator bounds the speeds it measures by what the limit allows now
// (a limit may change while a job runs), read here the way the Go runtime
// reads it for GOMAXPROCS.

// capacity is the GEMM speed this node's CPU limit allows now (see
// cgroup.CPUs), 0 without a limit: its speed between throttles times the
// share of its threads the limit leaves. Stages ask every step; the limit
// is read at most once a second.
type capacity struct {
	// burst is the GEMM speed between the throttles of a CPU quota (the
	// profile's GEMMGFLOPS is over whole quota periods): the reference
	// of the profiles this node's coordinators measure.
	burst   float64
	threads int

	mu    sync.Mutex // guards limit, cpus and at
	limit float64
	cpus  float64
	at    time.Time // when limit was computed
}

// now is the capacity (actors.StageHost's Capacity) and the CPUs the
// limit leaves the node's threads (its CPULimit), both 0 without a limit.
func (c *capacity) now() (gflops, cpus float64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if now := time.Now(); now.Sub(c.at) >= time.Second {
		c.at = now
		c.limit, c.cpus = 0, 0
		if cpus, ok := cgroup.CPUs(); ok {
			c.cpus = min(cpus, float64(c.threads))
			c.limit = c.burst * c.cpus / float64(c.threads)
		}
	}
	return c.limit, c.cpus
}
