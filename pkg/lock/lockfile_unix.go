//go:build unix

package lock

import (
	"errors"
	"os"
	"syscall"
)

// errLocked says another process holds a file's lock.
var errLocked = errors.New("locked by another process")

// lockFile takes an exclusive lock on f without waiting (flock(2): it is
// released when f is closed, or when the process ends however it ends).
func lockFile(f *os.File) error {
	err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
	if errors.Is(err, syscall.EWOULDBLOCK) {
		return errLocked
	}
	return err
}
