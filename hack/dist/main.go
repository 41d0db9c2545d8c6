// Command dist packages the kubectl plugin for a release, as krew expects
// it (`make dist`):
//
//   - for each platform, dist/kubectl-buildlock_<version>_<os>_<arch>.tar.gz
//     (.zip for windows) holding the binary, LICENSE and README.md;
//   - dist/checksums.txt, the archives' SHA-256 sums in sha256sum's format;
//   - dist/buildlock.yaml, the krew manifest (a krew index's
//     plugins/buildlock.yaml) pointing at the archives on the release page,
//     https://github.com/buildlock/buildlock/releases/download/<version>/.
//
// Usage:
//
//	go run ./hack/dist -version v0.2.0 [-platforms linux/amd64,darwin/arm64] [-out dist]
//
// Archives are reproducible: their files carry SOURCE_DATE_EPOCH (else
// 1980-01-01) as their time, and the binaries are built with -trimpath.
package main

import (
	"archive/tar"
	"archive/zip"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/template"
	"time"

	"k8s.io/apimachinery/pkg/util/version"
)

// Platforms is what a release is built for.
var Platforms = []string{"linux/amd64", "linux/arm64", "darwin/amd64", "darwin/arm64", "windows/amd64", "windows/arm64"}

const (
	// plugin is the binary's name, and pluginName the plugin's in krew.
	plugin     = "kubectl-buildlock"
	pluginName = "buildlock"
	// releaseURL is where a release's archives are downloaded from.
	releaseURL = "https://github.com/buildlock/buildlock/releases/download"
)

func main() {
	var r Release
	flag.StringVar(&r.Version, "version", "", "the release's version, v<semver> (required)")
	platforms := flag.String("platforms", strings.Join(Platforms, ","), "comma-separated os/arch pairs to build")
	flag.StringVar(&r.Out, "out", "dist", "where to write the archives, checksums.txt and "+pluginName+".yaml")
	flag.StringVar(&r.Root, "root", ".", "the repository root, with the plugin's source")
	flag.StringVar(&r.License, "license", "LICENSE", "the license file to ship (krew requires one), relative to -root")
	flag.StringVar(&r.Readme, "readme", "README.md", "the README to ship, relative to -root")
	flag.Parse()
	if err := r.Dist(strings.Split(*platforms, ",")); err != nil {
		fmt.Fprintf(os.Stderr, "dist: %v\n", err)
		os.Exit(1)
	}
}

// Release is one release of the plugin.
type Release struct {
	// Version is v and a semantic version.
	Version string
	// Root is the repository's root; Out where to write. License and
	// Readme are shipped in every archive (relative paths are to Root).
	Root, Out, License, Readme string
}

// Artifact is one platform's archive.
type Artifact struct {
	OS, Arch string
	// File is the archive's name, SHA256 its sum.
	File, SHA256 string
}

// Bin is the binary's name in the archive.
func (a Artifact) Bin() string {
	if a.OS == "windows" {
		return plugin + ".exe"
	}
	return plugin
}

// URI is where the release serves the archive.
func (a Artifact) URI(ver string) string {
	return releaseURL + "/" + ver + "/" + a.File
}

// Dist builds the plugin for each platform into r.Out, with the archives'
// checksums and the krew manifest.
func (r Release) Dist(platforms []string) error {
	if _, err := version.ParseSemantic(r.Version); err != nil || !strings.HasPrefix(r.Version, "v") {
		return fmt.Errorf("-version %q must be v and a semantic version (krew's rule), for example v0.2.0", r.Version)
	}
	if err := os.MkdirAll(r.Out, 0o755); err != nil {
		return err
	}
	var artifacts []Artifact
	for _, p := range platforms {
		goos, goarch, ok := strings.Cut(p, "/")
		if !ok {
			return fmt.Errorf("platform %q is not os/arch", p)
		}
		a, err := r.Package(goos, goarch)
		if err != nil {
			return fmt.Errorf("packaging for %s: %w", p, err)
		}
		fmt.Printf("%s  %s\n", a.SHA256, filepath.Join(r.Out, a.File))
		artifacts = append(artifacts, a)
	}
	var sums strings.Builder
	for _, a := range artifacts {
		fmt.Fprintf(&sums, "%s  %s\n", a.SHA256, a.File)
	}
	if err := os.WriteFile(filepath.Join(r.Out, "checksums.txt"), []byte(sums.String()), 0o644); err != nil {
		return err
	}
	manifest, err := Manifest(r.Version, artifacts)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(r.Out, pluginName+".yaml"), manifest, 0o644)
}

// Package builds the plugin for goos/goarch and archives it with the license
// and the README into r.Out.
func (r Release) Package(goos, goarch string) (Artifact, error) {
	a := Artifact{OS: goos, Arch: goarch, File: fmt.Sprintf("%s_%s_%s_%s.tar.gz", plugin, r.Version, goos, goarch)}
	if goos == "windows" {
		a.File = strings.TrimSuffix(a.File, ".tar.gz") + ".zip"
	}
	files := map[string]string{"LICENSE": r.path(r.License), "README.md": r.path(r.Readme)} // name in the archive: path
	for name, path := range files {
		if _, err := os.Stat(path); err != nil {
			return a, fmt.Errorf("every archive ships a %s (krew installs only archives with a license): %w", name, err)
		}
	}
	tmp, err := os.MkdirTemp("", "dist-")
	if err != nil {
		return a, err
	}
	defer os.RemoveAll(tmp)
	files[a.Bin()] = filepath.Join(tmp, a.Bin())
	build := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w -X main.version="+r.Version, "-o", files[a.Bin()], "./cmd/"+plugin)
	build.Dir, build.Stdout, build.Stderr = r.Root, os.Stderr, os.Stderr
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS="+goos, "GOARCH="+goarch)
	if err := build.Run(); err != nil {
		return a, fmt.Errorf("go build: %w", err)
	}
	var archive bytes.Buffer
	if goos == "windows" {
		err = writeZip(&archive, files)
	} else {
		err = writeTarGz(&archive, files)
	}
	if err != nil {
		return a, err
	}
	sum := sha256.Sum256(archive.Bytes())
	a.SHA256 = hex.EncodeToString(sum[:])
	return a, os.WriteFile(filepath.Join(r.Out, a.File), archive.Bytes(), 0o644)
}

// path is p relative to the repository root, unless it is absolute.
func (r Release) path(p string) string {
	if filepath.IsAbs(p) {
		return p
	}
	return filepath.Join(r.Root, p)
}

// fileTime is the time the archives' files carry.
func fileTime() time.Time {
	if s, err := strconv.ParseInt(os.Getenv("SOURCE_DATE_EPOCH"), 10, 64); err == nil {
		return time.Unix(s, 0).UTC()
	}
	return time.Date(1980, 1, 1, 0, 0, 0, 0, time.UTC)
}

// sortedNames are files' names in a stable order, the binary first.
func sortedNames(files map[string]string) []string {
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	slices.SortFunc(names, func(a, b string) int {
		return strings.Compare(strings.TrimPrefix(a, plugin), strings.TrimPrefix(b, plugin))
	})
	return names
}

func mode(name string) int64 {
	if strings.HasPrefix(name, plugin) {
		return 0o755
	}
	return 0o644
}

func writeTarGz(w io.Writer, files map[string]string) error {
	gz := gzip.NewWriter(w)
	tw := tar.NewWriter(gz)
	for _, name := range sortedNames(files) {
		data, err := os.ReadFile(files[name])
		if err != nil {
			return err
		}
		hdr := &tar.Header{Name: name, Mode: mode(name), Size: int64(len(data)), ModTime: fileTime(), Typeflag: tar.TypeReg, Format: tar.FormatPAX}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if _, err := tw.Write(data); err != nil {
			return err
		}
	}
	return errors.Join(tw.Close(), gz.Close())
}

func writeZip(w io.Writer, files map[string]string) error {
	zw := zip.NewWriter(w)
	for _, name := range sortedNames(files) {
		data, err := os.ReadFile(files[name])
		if err != nil {
			return err
		}
		hdr := &zip.FileHeader{Name: name, Method: zip.Deflate, Modified: fileTime()}
		hdr.SetMode(os.FileMode(mode(name)))
		f, err := zw.CreateHeader(hdr)
		if err != nil {
			return err
		}
		if _, err := f.Write(data); err != nil {
			return err
		}
	}
	return zw.Close()
}

// manifestTemplate is krew's plugin manifest (apiVersion
// krew.googlecontainertools.github.com/v1alpha2), one platform per archive.
var manifestTemplate = template.Must(template.New(pluginName).Parse(`apiVersion: krew.googlecontainertools.github.com/v1alpha2
kind: Plugin
metadata:
  name: {{.Name}}
spec:
  version: {{.Version}}
  homepage: https://github.com/buildlock/buildlock
  shortDescription: Make CI/CD pipelines take turns deploying
  description: |
    Pipelines take turns deploying into a shared namespace with the buildlock
    operator: a build claims the target (a BuildLock), waits until the
    operator grants it, deploys with a fencing token, and releases it.
    "kubectl buildlock acquire --target staging -- ./deploy.sh" does it all;
    "status" shows who holds each target and who waits in which order.
    Needs the buildlock operator in the cluster.
  platforms:
{{- range .Artifacts}}
  - selector:
      matchLabels:
        os: {{.OS}}
        arch: {{.Arch}}
    uri: {{.URI $.Version}}
    sha256: "{{.SHA256}}"
    bin: {{.Bin}}
{{- end}}
`))

// Manifest renders the krew manifest of the release ver with artifacts.
func Manifest(ver string, artifacts []Artifact) ([]byte, error) {
	var b bytes.Buffer
	err := manifestTemplate.Execute(&b, map[string]any{"Name": pluginName, "Version": ver, "Artifacts": artifacts})
	return b.Bytes(), err
}
