// Package rehearsal is `make release-rehearsal`: the release of a v* tag,
// run whole and offline.
//
// TestRehearsal starts an in-process OCI registry (go-containerregistry's)
// and runs `make release` against it, the target the release workflow runs
// against ghcr.io: GoReleaser's archives, checksums and krew manifest, ko's
// two images with their SBOMs, the chart as OCI, install.yaml and the Tekton
// Task pinned to the plugin image's digest, each in its folder of dist/.
// It checks what they hold, signs the images, the chart and checksums.txt
// with a throwaway key (cosign's library, key-based: no Fulcio, no Rekor)
// and verifies them, then installs buildlock each way a user would on a
// local control plane (the one `make run` starts): `helm install oci://...`
// after verifying the chart, and `kubectl apply -f install.yaml`; and the
// plugin with `krew install --manifest`. There is no kubelet, so the
// manager runs as a process: the binary taken from the image the chart or
// install.yaml names, with the Deployment's arguments, as its
// ServiceAccount (a token from the TokenRequest API). Through each install
// the krew-installed plugin takes a claim, which goes Held.
//
// The rehearsal's differences from the release, all forced by the lack of
// a network: the images are built on stand-ins for their bases (pushed to
// the registry here; the release's bases are the Dockerfiles' pinned
// digests), the signatures are key-based instead of keyless, and GoReleaser
// neither signs, writes SBOMs with syft, nor publishes.
//
// It is a module of its own so that cosign's dependencies stay out of the
// operator's go.mod; it builds against this checkout through a replace.
package rehearsal
