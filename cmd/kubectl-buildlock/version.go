package main

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"
)

const versionLong = `Show the plugin's version and how it was built: its release (the archives and
images of a release carry it; "go install ...@v0.2.0" reports the module's
version), the commit and whether the tree had changes, the Go version and the
platform. -o json and -o yaml print the same fields, as kubectl version does.

Exit codes: 0 shown, 2 usage error.`

// versionInfo is what `kubectl buildlock version` prints: kubectl
// version's clientVersion fields that a plugin has.
type versionInfo struct {
	Version      string `json:"version"`
	GitCommit    string `json:"gitCommit,omitempty"`
	GitTreeState string `json:"gitTreeState,omitempty"`
	BuildDate    string `json:"buildDate,omitempty"`
	GoVersion    string `json:"goVersion"`
	Platform     string `json:"platform"`
}

// currentVersion is this binary's versionInfo.
func currentVersion() versionInfo {
	bi, _ := debug.ReadBuildInfo()
	return versionOf(version, bi, runtime.Version(), runtime.GOOS+"/"+runtime.GOARCH)
}

// versionOf is the versionInfo of a binary whose -X main.version is
// release (empty unless a release build set it), with build info bi (nil
// when the binary has none). The release wins; else the main module's
// version from the build info: the module version for `go install
// ...@vX`, a pseudo-version for a build in a git checkout; else "dev".
func versionOf(release string, bi *debug.BuildInfo, goVersion, platform string) versionInfo {
	v := versionInfo{Version: release, GoVersion: goVersion, Platform: platform}
	if bi == nil {
		v.Version = cmp.Or(v.Version, "dev")
		return v
	}
	if v.Version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		v.Version = bi.Main.Version
	}
	v.Version = cmp.Or(v.Version, "dev")
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			v.GitCommit = s.Value
		case "vcs.time":
			v.BuildDate = s.Value
		case "vcs.modified":
			v.GitTreeState = map[string]string{"true": "dirty", "false": "clean"}[s.Value]
		}
	}
	return v
}

// versionOptions is `kubectl buildlock version`.
type versionOptions struct {
	f      *factory
	output string
}

func newVersionCommand(o *versionOptions) *cobra.Command {
	cmd := newCommand(o, "version [-o json|yaml]", "Show the plugin's version, commit and Go version", versionLong,
		"  kubectl buildlock version\n  kubectl buildlock version -o json")
	cmd.Args = cobra.NoArgs
	cmd.Flags().StringVarP(&o.output, "output", "o", "", "Output format. One of: (json, yaml).")
	_ = cmd.RegisterFlagCompletionFunc("output", cobra.FixedCompletions([]string{"json", "yaml"}, cobra.ShellCompDirectiveNoFileComp))
	return cmd
}

func (o *versionOptions) Complete(*cobra.Command, []string) error { return nil }

func (o *versionOptions) Validate() error {
	if o.output != "" && o.output != "json" && o.output != "yaml" {
		return fmt.Errorf("--output must be json or yaml, not %q", o.output)
	}
	return nil
}

func (o *versionOptions) Run(context.Context) error {
	v := currentVersion()
	out := o.f.streams.Out
	switch o.output {
	case "json":
		data, err := json.MarshalIndent(v, "", "  ")
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(out, "%s\n", data)
		return err
	case "yaml":
		data, err := yaml.Marshal(v)
		if err != nil {
			return err
		}
		_, err = out.Write(data)
		return err
	}
	commit := cmp.Or(v.GitCommit, "unknown")
	if v.GitTreeState != "" {
		commit += " (" + v.GitTreeState + ")"
	}
	rows := [][2]string{{"Version:", v.Version}, {"Git commit:", commit}}
	if v.BuildDate != "" {
		rows = append(rows, [2]string{"Commit time:", v.BuildDate})
	}
	rows = append(rows, [2]string{"Go version:", v.GoVersion}, [2]string{"Platform:", v.Platform})
	var b strings.Builder
	for _, r := range rows {
		fmt.Fprintf(&b, "%-13s%s\n", r[0], r[1])
	}
	_, err := io.WriteString(out, b.String())
	return err
}
