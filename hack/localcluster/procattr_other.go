//go:build !linux

package main

import "syscall"

// childProcAttr starts the manager binary in a process group of its own, so
// that the terminal's Ctrl-C reaches only this process, which stops it in
// order.
func childProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
