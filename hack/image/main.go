// Command image builds buildlock's container images without Docker, with
// go-containerregistry: for each platform it cross-compiles one command of
// this module (static, CGO-free, -trimpath) and adds it as one layer on a
// base image, then writes the multi-platform image index as an OCI layout
// and, with -push, pushes it to a registry. `make image` builds the
// manager's; the release workflow pushes the manager's and the plugin's.
//
// The manager's image has no base (scratch): the binary embeds the time-zone
// database (time/tzdata) and CA roots (golang.org/x/crypto/x509roots/fallback,
// used when the image has none), it runs as 65532:65532 (distroless's
// nonroot), and its only file is /manager. The plugin's image, for the
// Tekton Task, needs /bin/sh for the Task's scripts: it adds
// /usr/local/bin/kubectl-buildlock to a base (-base), whose name and
// digest the image's labels record (org.opencontainers.image.base.*).
//
// Images are reproducible: files and the image's creation time carry
// SOURCE_DATE_EPOCH (else the Unix epoch), so the same commit built with the
// same Go gives the same digests. The Dockerfile builds the same manager
// for Docker users; test/chart checks that the two stay in step.
//
// Usage:
//
//	go run ./hack/image -version v0.2.0 -out dist/image [-push ghcr.io/buildlock/buildlock:v0.2.0]
//	go run ./hack/image -cmd ./cmd/kubectl-buildlock -base busybox@sha256:... -version v0.2.0 -out dist/plugin-image
package main

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Source is the repository the images' labels point to.
const Source = "https://github.com/buildlock/buildlock"

// Spec is one image to build.
type Spec struct {
	// Cmd is the package to build (./cmd/manager), Root the module's root.
	Cmd, Root string
	// Version, Revision: the release and the commit, for the labels and,
	// for the plugin, its version (-X main.version).
	Version, Revision string
	// Platforms are os/arch pairs.
	Platforms []string
	// Base is the base image's reference; empty builds on no base.
	Base string
	// Dir is where in the image the binary goes; User runs it.
	Dir, User string
	// Title and Description are the images' labels of those names.
	Title, Description string
	// Insecure allows plain-HTTP registries (the tests' in-process one).
	Insecure bool
}

func main() {
	s := Spec{Root: "."}
	var platforms, out, push string
	var printBuild bool
	flag.StringVar(&s.Cmd, "cmd", "./cmd/manager", "the command to build into the image")
	flag.StringVar(&s.Version, "version", "", "the release, v<semver> (required): the version label, and the plugin's version")
	flag.StringVar(&s.Revision, "revision", "", "the commit, for the revision label (default: git rev-parse HEAD)")
	flag.StringVar(&platforms, "platforms", "linux/amd64,linux/arm64", "comma-separated os/arch pairs")
	flag.StringVar(&s.Base, "base", "", "the base image (its digest is recorded in the labels); none when empty")
	flag.StringVar(&s.Dir, "dir", "/", "the directory of the binary in the image")
	flag.StringVar(&s.User, "user", "65532:65532", "the user:group that runs the entrypoint")
	flag.StringVar(&s.Title, "title", "buildlock", "the image's title label")
	flag.StringVar(&s.Description, "description", "The buildlock operator: CI/CD pipelines take turns deploying into a Kubernetes namespace.", "the image's description label")
	flag.BoolVar(&s.Insecure, "insecure", false, "talk plain HTTP to the base's and -push's registry")
	flag.StringVar(&out, "out", "", "write the image index as an OCI layout into this directory")
	flag.StringVar(&push, "push", "", "push the image index to this reference (registry/repository:tag)")
	flag.BoolVar(&printBuild, "print-build", false, "print the go build command of linux/amd64, as a JSON array, and exit")
	flag.Parse()
	s.Platforms = strings.Split(platforms, ",")
	if err := run(s, out, push, printBuild); err != nil {
		fmt.Fprintf(os.Stderr, "image: %v\n", err)
		os.Exit(1)
	}
}

func run(s Spec, out, push string, printBuild bool) error {
	if printBuild {
		data, err := json.Marshal(s.BuildCommand("linux", "amd64", "OUT"))
		fmt.Println(string(data))
		return err
	}
	if !strings.HasPrefix(s.Version, "v") {
		return fmt.Errorf("-version %q must be v and a semantic version, for example v0.2.0", s.Version)
	}
	if out == "" && push == "" {
		return errors.New("nothing to do: give -out, -push or both")
	}
	if s.Revision == "" {
		rev, err := exec.Command("git", "-C", s.Root, "rev-parse", "HEAD").Output()
		if err != nil {
			return fmt.Errorf("finding the commit (or pass -revision): %w", err)
		}
		s.Revision = strings.TrimSpace(string(rev))
	}
	idx, err := s.Build()
	if err != nil {
		return err
	}
	digest, err := idx.Digest()
	if err != nil {
		return err
	}
	if out != "" {
		if err := WriteLayout(out, idx, s.Version); err != nil {
			return err
		}
	}
	if push != "" {
		ref, err := name.ParseReference(push, s.nameOptions()...)
		if err != nil {
			return fmt.Errorf("parsing -push %q: %w", push, err)
		}
		if err := remote.WriteIndex(ref, idx, remote.WithAuthFromKeychain(authn.DefaultKeychain)); err != nil {
			return fmt.Errorf("pushing %s: %w", ref, err)
		}
	}
	fmt.Println(digest)
	return nil
}

func (s Spec) nameOptions() []name.Option {
	if s.Insecure {
		return []name.Option{name.Insecure}
	}
	return nil
}

// Bin is the binary's name: the command's directory's.
func (s Spec) Bin() string { return path.Base(s.Cmd) }

// Entrypoint is where the binary is in the image.
func (s Spec) Entrypoint() string { return path.Join("/", s.Dir, s.Bin()) }

// BuildCommand is the go build of the binary for goos/goarch into out (the
// Dockerfile's build line, with the plugin's version for the plugin).
func (s Spec) BuildCommand(goos, goarch, out string) []string {
	ldflags := "-s -w"
	if s.Bin() == "kubectl-buildlock" {
		ldflags += " -X main.version=" + s.Version
	}
	return []string{"CGO_ENABLED=0", "GOOS=" + goos, "GOARCH=" + goarch,
		"go", "build", "-trimpath", "-ldflags=" + ldflags, "-o", out, s.Cmd}
}

// Build builds the binary for each platform and returns the image index.
func (s Spec) Build() (v1.ImageIndex, error) {
	created := sourceDate()
	tmp, err := os.MkdirTemp("", "image-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	for _, p := range s.Platforms {
		goos, goarch, ok := strings.Cut(p, "/")
		if !ok {
			return nil, fmt.Errorf("platform %q is not os/arch", p)
		}
		bin := filepath.Join(tmp, goos+"-"+goarch, s.Bin())
		cmd := s.BuildCommand(goos, goarch, bin)
		build := exec.Command(cmd[3], cmd[4:]...)
		build.Dir, build.Stdout, build.Stderr = s.Root, os.Stderr, os.Stderr
		build.Env = append(os.Environ(), cmd[:3]...)
		if err := build.Run(); err != nil {
			return nil, fmt.Errorf("building %s for %s: %w", s.Cmd, p, err)
		}
		img, err := s.image(goos, goarch, bin, created)
		if err != nil {
			return nil, fmt.Errorf("the image for %s: %w", p, err)
		}
		cf, err := img.ConfigFile()
		if err != nil {
			return nil, err
		}
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{
			Platform: &v1.Platform{OS: cf.OS, Architecture: cf.Architecture, Variant: cf.Variant},
		}})
	}
	return idx, nil
}

// image is the base's image for goos/goarch with the binary at bin added.
func (s Spec) image(goos, goarch, bin string, created time.Time) (v1.Image, error) {
	base, err := s.baseImage(goos, goarch)
	if err != nil {
		return nil, err
	}
	layer, err := binaryLayer(bin, s.Entrypoint(), created)
	if err != nil {
		return nil, err
	}
	img, err := mutate.Append(base, mutate.Addendum{Layer: layer, History: v1.History{
		Created: v1.Time{Time: created}, CreatedBy: "hack/image: " + s.Entrypoint(), Comment: "buildlock " + s.Version,
	}})
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Created = goos, goarch, v1.Time{Time: created}
	cf.Config.Entrypoint, cf.Config.Cmd, cf.Config.User, cf.Config.WorkingDir = []string{s.Entrypoint()}, nil, s.User, "/"
	if cf.Config.Labels == nil {
		cf.Config.Labels = map[string]string{}
	}
	for k, v := range s.Labels(created) {
		cf.Config.Labels[k] = v
	}
	if s.Base != "" {
		digest, err := base.Digest()
		if err != nil {
			return nil, err
		}
		cf.Config.Labels["org.opencontainers.image.base.name"] = s.Base
		cf.Config.Labels["org.opencontainers.image.base.digest"] = digest.String()
	}
	return mutate.ConfigFile(img, cf)
}

// Labels are the OCI image labels (annotations' keys) of the image.
func (s Spec) Labels(created time.Time) map[string]string {
	return map[string]string{
		"org.opencontainers.image.title":       s.Title,
		"org.opencontainers.image.description": s.Description,
		"org.opencontainers.image.source":      Source,
		"org.opencontainers.image.url":         Source,
		"org.opencontainers.image.licenses":    "Apache-2.0",
		"org.opencontainers.image.version":     s.Version,
		"org.opencontainers.image.revision":    s.Revision,
		"org.opencontainers.image.created":     created.Format(time.RFC3339),
	}
}

// baseImage is the base for goos/goarch: nothing (with OCI media types), or
// the platform's image of the base index.
func (s Spec) baseImage(goos, goarch string) (v1.Image, error) {
	if s.Base == "" {
		return mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON), nil
	}
	ref, err := name.ParseReference(s.Base, s.nameOptions()...)
	if err != nil {
		return nil, fmt.Errorf("parsing -base %q: %w", s.Base, err)
	}
	img, err := remote.Image(ref, remote.WithPlatform(v1.Platform{OS: goos, Architecture: goarch}), remote.WithAuthFromKeychain(authn.DefaultKeychain))
	if err != nil {
		return nil, fmt.Errorf("pulling the base %s for %s/%s: %w", ref, goos, goarch, err)
	}
	return img, nil
}

// binaryLayer is a layer holding the file at bin as target (its parent
// directories too), owned by root, executable by all, dated created.
func binaryLayer(bin, target string, created time.Time) (v1.Layer, error) {
	data, err := os.ReadFile(bin)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dir := path.Dir(strings.TrimPrefix(target, "/"))
	var dirs []string
	for d := dir; d != "."; d = path.Dir(d) {
		dirs = append([]string{d}, dirs...)
	}
	for _, d := range dirs {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: 0o755, ModTime: created, Format: tar.FormatPAX}); err != nil {
			return nil, err
		}
	}
	hdr := &tar.Header{Typeflag: tar.TypeReg, Name: strings.TrimPrefix(target, "/"), Mode: 0o755, Size: int64(len(data)), ModTime: created, Format: tar.FormatPAX}
	if err := tw.WriteHeader(hdr); err != nil {
		return nil, err
	}
	if _, err := tw.Write(data); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	layerData := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerData)), nil
	}, tarball.WithMediaType(types.OCILayer))
}

// WriteLayout writes idx as an OCI image layout into dir (replacing what
// was there), its index.json naming it version.
func WriteLayout(dir string, idx v1.ImageIndex, version string) error {
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return fmt.Errorf("writing the OCI layout %s: %w", dir, err)
	}
	return p.AppendIndex(idx, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": version}))
}

// sourceDate is SOURCE_DATE_EPOCH, else the Unix epoch.
func sourceDate() time.Time {
	if s, err := strconv.ParseInt(os.Getenv("SOURCE_DATE_EPOCH"), 10, 64); err == nil {
		return time.Unix(s, 0).UTC()
	}
	return time.Unix(0, 0).UTC()
}
