//go:build !linux && !windows

package main

import "syscall"

// dieWithParent does nothing where there is no PR_SET_PDEATHSIG: a
// supervisor killed alone leaves CMD to the plugin (command.wait).
func dieWithParent(*syscall.SysProcAttr) {}
