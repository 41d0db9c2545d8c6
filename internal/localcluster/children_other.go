//go:build !linux

package localcluster

import "errors"

// canDieWithParent: only Linux has PR_SET_PDEATHSIG; elsewhere the control
// plane is stopped by a clean exit only.
const canDieWithParent = false

func dieWithParent() error { return errors.New("not supported on this system") }
