package main

// The binary carries what a distroless base gives an image, so that it runs
// on any base (the release's is distroless static) or none. The time-zone database serves
// policies' IANA time zones, and the CA roots (used only when the system
// has none) verify endpoints outside the cluster; the API server's own CA
// comes with the pod's service account.
import (
	_ "time/tzdata"

	_ "golang.org/x/crypto/x509roots/fallback"
)
