//go:build !unix

package actors

import "time"

// processCPU is unknown here.
func processCPU() time.Duration { return 0 }
