package localcluster

import (
	"errors"
	"os"

	"golang.org/x/sys/unix"
)

// canDieWithParent: Linux sends a child a signal of its choice when its
// parent dies (PR_SET_PDEATHSIG), whatever killed the parent.
const canDieWithParent = true

// dieWithParent asks for SIGTERM when the parent dies, and fails when it
// has died already (this process was then handed to another).
func dieWithParent() error {
	parent := os.Getppid()
	if err := unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(unix.SIGTERM), 0, 0, 0); err != nil {
		return err
	}
	if os.Getppid() != parent || parent == 1 {
		return errors.New("the parent process has exited")
	}
	return nil
}
