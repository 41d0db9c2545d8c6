package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/buildlock/buildlock/pkg/lock"
)

const buildNumberLong = `Print a build number for a CI system that numbers no builds: for a Tekton
PipelineRun (--pipelinerun), its creation time in seconds since 1970-01-01 UTC, as
the API server stamped it. A PipelineRun created later is a newer build; the
TaskRuns of one PipelineRun, and its re-runs of a task, get the same number. Two
PipelineRuns created in the same second get the same number, and the later one
counts as a re-run of the earlier. The catalog Task buildlock-deploy uses it when
its build param is empty.

Needs get on pipelineruns.tekton.dev in the namespace.

Exit codes: 0 printed, 1 error, 2 usage error.`

// buildNumberOptions is `kubectl buildlock build-number`.
type buildNumberOptions struct {
	f                      *factory
	pipelineRun, namespace string
}

func newBuildNumberCommand(o *buildNumberOptions) *cobra.Command {
	cmd := newCommand(o, "build-number --pipelinerun NAME", "Print a build number for a Tekton PipelineRun (its creation time)", buildNumberLong,
		"  kubectl buildlock build-number -n ci --pipelinerun shop-deploy-x7k2p")
	cmd.Args = cobra.NoArgs
	cmd.Flags().StringVar(&o.pipelineRun, "pipelinerun", "", "The Tekton PipelineRun whose creation time numbers the build (in a TaskRun's pod: its label tekton.dev/pipelineRun).")
	return cmd
}

func (o *buildNumberOptions) Complete(*cobra.Command, []string) error {
	var err error
	o.namespace, err = o.f.namespace()
	return err
}

func (o *buildNumberOptions) Validate() error {
	if o.pipelineRun == "" {
		return errors.New("missing --pipelinerun: the PipelineRun whose creation time numbers the build")
	}
	return nil
}

func (o *buildNumberOptions) Run(ctx context.Context) error {
	c, err := o.f.client()
	if err != nil {
		return err
	}
	build, err := lock.PipelineRunBuild(ctx, c, o.namespace, o.pipelineRun)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(o.f.streams.Out, build)
	return err
}
