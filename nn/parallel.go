package nn

import "sync"

// parallel splits [0, n) into at most threads contiguous chunks of at least
// grain items and runs fn on each. The split depends only on n, threads and
// grain, so work that writes disjoint outputs is deterministic; reductions
// must not be split across chunks.
func parallel(threads, n, grain int, fn func(lo, hi int)) {
	if grain < 1 {
		grain = 1
	}
	chunks := min(threads, (n+grain-1)/grain)
	if chunks <= 1 {
		fn(0, n)
		return
	}
	var wg sync.WaitGroup
	step := (n + chunks - 1) / chunks
	for lo := step; lo < n; lo += step {
		wg.Add(1)
		go func(lo, hi int) {
			defer wg.Done()
			fn(lo, hi)
		}(lo, min(lo+step, n))
	}
	fn(0, min(step, n))
	wg.Wait()
}

func threadsOf(c *Ctx) int {
	if c == nil || c.Backend == nil {
		return 1
	}
	return c.Backend.Threads()
}
