package rehearsal

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/sigstore/cosign/v3/pkg/cosign"
	"github.com/sigstore/cosign/v3/pkg/oci/mutate"
	ociremote "github.com/sigstore/cosign/v3/pkg/oci/remote"
	"github.com/sigstore/cosign/v3/pkg/oci/static"
	"github.com/sigstore/sigstore/pkg/signature"
	"github.com/sigstore/sigstore/pkg/signature/payload"
)

// signer signs and verifies with a throwaway ECDSA P-256 key, as `cosign
// sign --key` and `cosign verify --key` do with the transparency log off:
// an image's (or chart's) signature is cosign's simple-signing payload for
// its digest, stored beside it under cosign's tag (sha256-<digest>.sig).
type signer struct {
	sv signature.SignerVerifier
}

func newSigner(t *testing.T) *signer {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	sv, err := signature.LoadECDSASignerVerifier(key, crypto.SHA256)
	if err != nil {
		t.Fatal(err)
	}
	return &signer{sv: sv}
}

// signImage signs the manifest or index ref with cosign's library.
func (s *signer) signImage(ctx context.Context, ref name.Digest) error {
	opts := ociremote.WithRemoteOptions(remote.WithContext(ctx))
	se, err := ociremote.SignedEntity(ref, opts)
	if err != nil {
		return fmt.Errorf("reading %s: %w", ref, err)
	}
	p, err := payload.Cosign{Image: ref}.MarshalJSON()
	if err != nil {
		return err
	}
	sig, err := s.sv.SignMessage(bytes.NewReader(p))
	if err != nil {
		return err
	}
	ociSig, err := static.NewSignature(p, base64.StdEncoding.EncodeToString(sig))
	if err != nil {
		return err
	}
	if se, err = mutate.AttachSignatureToEntity(se, ociSig); err != nil {
		return err
	}
	return ociremote.WriteSignatures(ref.Repository, se, opts)
}

// verifyImage verifies ref's signatures with this key as `cosign verify
// --key --insecure-ignore-tlog` does: cosign's VerifyImageSignatures.
func (s *signer) verifyImage(ctx context.Context, ref name.Reference) error {
	sigs, _, err := cosign.VerifyImageSignatures(ctx, ref, &cosign.CheckOpts{
		SigVerifier:        s.sv,
		IgnoreTlog:         true,
		IgnoreSCT:          true,
		ClaimVerifier:      cosign.SimpleClaimVerifier,
		RegistryClientOpts: []ociremote.Option{ociremote.WithRemoteOptions(remote.WithContext(ctx))},
	})
	if err == nil && len(sigs) == 0 {
		return fmt.Errorf("no signature of %s verified", ref)
	}
	return err
}

// signBlob signs a file's contents (checksums.txt).
func (s *signer) signBlob(t *testing.T, data []byte) []byte {
	t.Helper()
	sig, err := s.sv.SignMessage(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	return sig
}

// verifyBlob verifies a signature of signBlob.
func (s *signer) verifyBlob(sig, data []byte) error {
	return s.sv.VerifySignature(bytes.NewReader(sig), bytes.NewReader(data))
}
