package main

import "syscall"

// dieWithParent makes the kernel kill the process started with a when the
// thread that started it ends (PR_SET_PDEATHSIG): CMD, when its supervisor
// is killed alone.
func dieWithParent(a *syscall.SysProcAttr) {
	a.Pdeathsig = syscall.SIGKILL
}
