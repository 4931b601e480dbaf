package nn

// ConvImpl names the oneDNN kernels l uses for batch size n (forward,
// backward data, backward weights), empty if it has none.
func ConvImpl(l *Conv2D, n int) [3]string { return l.dnnl.impl(n) }

// FusedReLUs is the number of ReLUs of s that the BatchNorm before them
// applies on the fast path.
func FusedReLUs(s *Stage) int {
	n := 0
	for _, j := range s.fused {
		n += btoi(j >= 0)
	}
	return n
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// WithTeam sets whether passes in c run as on the team thread: one oneDNN
// primitive over the whole batch and OpenMP threading (from whatever OS
// thread the test runs on).
func WithTeam(c *Ctx, team bool) *Ctx {
	c.team = team
	return c
}
