package localcluster

import (
	"errors"
	"os"

	"golang.org/x/sys/unix"
)

// canDieWithParent: Linux sends a child a signal of its choice when its
// parent dies (PR_SET_PDEATHSIG), whatever killed the parent.
const canDieWithParent = true

// dieWithParent asks for SIGKILL when the parent dies (a throwaway control
// plane has nothing to save, and a graceful stop can take a minute on a
// loaded machine), and fails when it
// has died already (this process was then handed to another).
func dieWithParent() error {
	parent := os.Getppid()
	if err := unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(unix.SIGKILL), 0, 0, 0); err != nil {
		return err
	}
	if os.Getppid() != parent || parent == 1 {
		return errors.New("the parent process has exited")
	}
	return nil
}
