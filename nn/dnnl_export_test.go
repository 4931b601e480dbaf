package nn

// ConvImpl names the oneDNN kernels l uses for batch size n (forward,
// backward data, backward weights), empty if it has none.
func ConvImpl(l *Conv2D, n int) [3]string { return l.dnnl.impl(n) }
