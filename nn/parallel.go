package nn

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// parallel splits [0, n) into at most threads contiguous chunks of at least
// grain items and runs fn on each, the first on the calling goroutine. The
// split depends only on n, threads and grain, so work that writes disjoint
// outputs is deterministic; reductions must not be split across chunks.
//
// Chunks run on a shared set of worker goroutines, started on first use and
// kept for the life of the process, so a call allocates nothing but what its
// caller's closure needs. A worker waiting for a chunk, and a caller waiting
// for its workers, poll for spinFor before they block: waking a parked
// goroutine's thread takes tens of microseconds on a virtual machine, longer
// than many chunks take.
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
	t := tasks.Get().(*task)
	t.fn = fn
	t.pending.Store(int32((n - 1) / step)) // the chunks after the first
	workers.ensure(chunks - 1)
	for lo := step; lo < n; lo += step {
		workers.jobs <- job{t: t, lo: lo, hi: min(lo+step, n)}
	}
	fn(0, min(step, n))
	spin(func() bool { return len(t.done) > 0 })
	<-t.done
	t.fn = nil
	tasks.Put(t)
}

// task is a call of parallel: done receives once its last worker chunk ends.
type task struct {
	fn      func(lo, hi int)
	pending atomic.Int32
	done    chan struct{}
}

type job struct {
	t      *task
	lo, hi int
}

// workerPool runs jobs; it holds no state that affects results.
type workerPool struct {
	mu   sync.Mutex // guards n
	n    int
	jobs chan job
}

var (
	workers = &workerPool{jobs: make(chan job, 64)}
	tasks   = sync.Pool{New: func() any { return &task{done: make(chan struct{}, 1)} }}
)

// ensure starts workers until at least k run.
func (p *workerPool) ensure(k int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for ; p.n < k; p.n++ {
		go p.work()
	}
}

func (p *workerPool) work() {
	for {
		spin(func() bool { return len(p.jobs) > 0 })
		j := <-p.jobs
		j.t.fn(j.lo, j.hi)
		if j.t.pending.Add(-1) == 0 {
			j.t.done <- struct{}{}
		}
	}
}

// spinFor bounds the polling of spin.
const spinFor = 200 * time.Microsecond

// spin polls ready until it reports true or spinFor has passed, yielding
// in between to other goroutines and to other threads (OpenMP's and
// OpenBLAS's, which a polling worker must not slow down).
func spin(ready func() bool) {
	if ready() {
		return
	}
	start := time.Now()
	for !ready() && time.Since(start) < spinFor {
		runtime.Gosched()
		osYield()
	}
}

func threadsOf(c *Ctx) int {
	if c == nil || c.Backend == nil {
		return 1
	}
	return c.Backend.Threads()
}
