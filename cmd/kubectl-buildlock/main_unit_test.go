package main

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
)

func TestHoistKubeFlags(t *testing.T) {
	tests := map[string]struct{ args, want []string }{
		"flags after the command stay":     {args: []string{"status", "-n", "ci"}, want: []string{"status", "-n", "ci"}},
		"flags before the command move":    {args: []string{"-n", "ci", "--context=dev", "status", "-A"}, want: []string{"status", "-n", "ci", "--context=dev", "-A"}},
		"they go before the command's --":  {args: []string{"--namespace", "ci", "acquire", "--", "x"}, want: []string{"acquire", "--namespace", "ci", "--", "x"}},
		"an unknown leading flag is left":  {args: []string{"--help"}, want: []string{"--help"}},
		"flags without a command are left": {args: []string{"-n", "ci"}, want: []string{"-n", "ci"}},
		"a flag missing its value is left": {args: []string{"-n"}, want: []string{"-n"}},
		"no arguments":                     {args: nil, want: nil},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := hoistKubeFlags(tc.args); !slices.Equal(got, tc.want) {
				t.Errorf("hoistKubeFlags(%q) = %q, want %q", tc.args, got, tc.want)
			}
		})
	}
}

// TestRunWithoutACluster runs the plugin in-process for what needs no
// cluster: help, usage errors, and a connection that fails.
func TestRunWithoutACluster(t *testing.T) {
	tests := map[string]struct {
		args       []string
		wantCode   int
		wantStdout string
		wantStderr string
	}{
		"no arguments print usage":           {args: nil, wantCode: exitUsage, wantStderr: "Usage:"},
		"--help lists exit codes":            {args: []string{"--help"}, wantCode: exitOK, wantStdout: "3         superseded"},
		"help for a command":                 {args: []string{"help", "force-release"}, wantCode: exitOK, wantStdout: "buildlock.io/force-release"},
		"a command's --help has examples":    {args: []string{"acquire", "--help"}, wantCode: exitOK, wantStdout: "Examples:"},
		"every command has help":             {args: []string{"status", "-h"}, wantCode: exitOK, wantStdout: "-A, --all-namespaces"},
		"release help":                       {args: []string{"release", "--help"}, wantCode: exitOK, wantStdout: "--mine"},
		"an unknown command":                 {args: []string{"lock"}, wantCode: exitUsage, wantStderr: `unknown command "lock"`},
		"help for an unknown command":        {args: []string{"help", "lock"}, wantCode: exitUsage, wantStderr: `unknown command "lock"`},
		"a usage error names the command":    {args: []string{"-n", "ci", "status", "-o", "xml"}, wantCode: exitUsage, wantStderr: "kubectl buildlock status --help"},
		"an invalid claim is a usage error":  {args: []string{"acquire", "--target=Staging", "--repo=a/b", "--branch=b", "--build=1"}, wantCode: exitUsage, wantStderr: `target "Staging"`},
		"a failed connection is an error":    {args: []string{"status"}, wantCode: exitError, wantStderr: "no kubeconfig here"},
		"force-release needs a reason first": {args: []string{"force-release", "--target=s"}, wantCode: exitUsage, wantStderr: "--reason is required"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			a := &app{stdout: &stdout, stderr: &stderr, connect: func(kubeFlags) (*kubeClient, error) {
				if strings.Contains(name, "invalid claim") {
					return &kubeClient{Namespace: "ci"}, nil
				}
				return nil, errors.New("no kubeconfig here")
			}}
			code := a.run(context.Background(), tc.args)
			if code != tc.wantCode {
				t.Errorf("exit code %d, want %d; stderr:\n%s", code, tc.wantCode, stderr.String())
			}
			if !strings.Contains(stdout.String(), tc.wantStdout) {
				t.Errorf("stdout does not contain %q:\n%s", tc.wantStdout, stdout.String())
			}
			if !strings.Contains(stderr.String(), tc.wantStderr) {
				t.Errorf("stderr does not contain %q:\n%s", tc.wantStderr, stderr.String())
			}
		})
	}
}
