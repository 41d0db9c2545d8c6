package main

// The plugin's image (the Tekton Task's default) has no CA certificates:
// the binary carries Mozilla's roots, used only when the system has none,
// for API servers whose certificates a public CA signed.
import _ "golang.org/x/crypto/x509roots/fallback"
