//go:build !linux

package dataplane

import (
	"net"
	"time"
)

// setUserTimeout does nothing here: TCP_USER_TIMEOUT is Linux's.
func setUserTimeout(tc *net.TCPConn, d time.Duration) {}
