package main

// The manager's image has no base (hack/image): the binary carries what a
// distroless base would have given it. The time-zone database serves
// policies' IANA time zones, and the CA roots (used only when the system
// has none) verify endpoints outside the cluster; the API server's own CA
// comes with the pod's service account.
import (
	_ "time/tzdata"

	_ "golang.org/x/crypto/x509roots/fallback"
)
