//go:build !linux

package main

import "syscall"

// childAttrs puts a demo node in its own process group; without Linux's
// parent-death signal, a node outlives a demo that is killed.
func childAttrs() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
