package nn

import (
	"fmt"
	"sync/atomic"
	"testing"
)

// parallel runs every item exactly once, in chunks that match its split,
// and returns only when all have run, whatever the thread count (more
// threads than workers started included) and however calls overlap.
func TestParallelRunsEveryItemOnce(t *testing.T) {
	for _, threads := range []int{1, 2, 3, 8} {
		for _, n := range []int{0, 1, 5, 9, 10, 1000} {
			for _, grain := range []int{0, 1, 3, 64} {
				t.Run(fmt.Sprintf("threads=%d/n=%d/grain=%d", threads, n, grain), func(t *testing.T) {
					for range 20 {
						seen := make([]atomic.Int32, n)
						var chunks atomic.Int32
						parallel(threads, n, grain, func(lo, hi int) {
							chunks.Add(1)
							for i := lo; i < hi; i++ {
								seen[i].Add(1)
							}
						})
						for i := range seen {
							if c := seen[i].Load(); c != 1 {
								t.Fatalf("item %d ran %d times", i, c)
							}
						}
						if c := int(chunks.Load()); c > max(1, threads) {
							t.Fatalf("%d chunks for %d threads", c, threads)
						}
					}
				})
			}
		}
	}
}

// Calls from several goroutines at once share the workers without
// mixing their chunks up.
func TestParallelConcurrentCalls(t *testing.T) {
	done := make(chan int64)
	for g := range 4 {
		go func() {
			var sum int64
			for range 200 {
				var s atomic.Int64
				parallel(3, 100, 1, func(lo, hi int) {
					for i := lo; i < hi; i++ {
						s.Add(int64(i + g))
					}
				})
				sum += s.Load()
			}
			done <- sum - 200*int64(4950+100*g)
		}()
	}
	for range 4 {
		if d := <-done; d != 0 {
			t.Fatalf("sums off by %d", d)
		}
	}
}
