package main

import "syscall"

// childAttrs puts a demo node in its own process group (Ctrl-C reaches the
// demo, which stops the nodes) and has the kernel stop it if the demo dies.
func childAttrs() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
}
