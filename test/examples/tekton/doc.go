// Package tekton validates the Tekton catalog Task and the example Pipeline
// with Tekton's own v1 types: strict decoding, defaulting and Validate, as
// the Tekton webhook does, plus the checks the webhook leaves to run time
// (a pipeline task's params against the Task's) and the catalog's metadata.
//
// It is a module of its own so that Tekton's dependencies stay out of the
// root go.mod; `make lint-examples` runs it.
package tekton
