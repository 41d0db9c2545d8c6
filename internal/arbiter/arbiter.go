// Package arbiter decides, for one lock, what every claim's state must be.
// (Placeholder: the rules and Decide are being written.)
package arbiter

import "time"

// Decide returns the decision for one lock at instant now.
func Decide(lock Lock, claims []Claim, grant Grant, now time.Time, policy Policy) Decision {
	panic("not implemented")
}
