package nn

import (
	"sync"
)

// parallel splits [0, n) into at most threads contiguous chunks of at least
// grain items and runs fn on each, the first on the calling goroutine. The
// split depends only on n, threads and grain, so work that writes disjoint
// outputs is deterministic; reductions must not be split across chunks.
//
// Chunks run on a shared set of worker goroutines, started on first use and
// kept for the life of the process, so a call allocates nothing but what its
// caller's closure needs.
func parallel(threads, n, grain int, fn func(lo, hi int)) {
	if grain < 1 {
		grain = 1
	}
	chunks := min(threads, (n+grain-1)/grain)
	if chunks <= 1 {
		fn(0, n)
		return
	}
	step := (n + chunks - 1) / chunks
	wg := waitGroups.Get().(*sync.WaitGroup)
	workers.ensure(chunks - 1)
	for lo := step; lo < n; lo += step {
		wg.Add(1)
		workers.jobs <- job{fn: fn, lo: lo, hi: min(lo+step, n), wg: wg}
	}
	fn(0, min(step, n))
	wg.Wait()
	waitGroups.Put(wg)
}

type job struct {
	fn     func(lo, hi int)
	lo, hi int
	wg     *sync.WaitGroup
}

// workerPool runs jobs; it holds no state that affects results.
type workerPool struct {
	mu   sync.Mutex // guards n
	n    int
	jobs chan job
}

var (
	workers    = &workerPool{jobs: make(chan job, 64)}
	waitGroups = sync.Pool{New: func() any { return new(sync.WaitGroup) }}
)

// ensure starts workers until at least k run.
func (p *workerPool) ensure(k int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for ; p.n < k; p.n++ {
		go func() {
			for j := range p.jobs {
				j.fn(j.lo, j.hi)
				j.wg.Done()
			}
		}()
	}
}

func threadsOf(c *Ctx) int {
	if c == nil || c.Backend == nil {
		return 1
	}
	return c.Backend.Threads()
}
