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
