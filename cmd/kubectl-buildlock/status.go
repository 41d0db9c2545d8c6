package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/duration"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/printers"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
	"github.com/buildlock/buildlock/pkg/lock"
)

const statusLong = `Show each lock (a target in a namespace): its ordering (from the BuildLockPolicy
named after the target, NewestWins without one), its holder with the fencing
token, and its queue in order (1 is next); then the last force-releases,
rollbacks and overrides, with who and why, that the lock's grant record keeps
after their claims are gone. -o json, yaml, jsonpath and go-template print the
summaries as a LockStatusList (items: namespace, target, ordering, holder,
queue, claims, audit); -o name prints the BuildLocks that hold and wait.

--watch (-w) prints them again whenever a claim changes them, until
interrupted, as kubectl get --watch does.

Exit codes: 0 shown (with --watch: interrupted), 1 error, 2 usage error.`

const statusExample = `  kubectl buildlock status
  kubectl buildlock status -A -o wide
  kubectl buildlock status --target staging -o yaml

  # Follow who holds staging and who waits, until Ctrl-C
  kubectl buildlock status --target staging --watch

  # The fencing token of the holder of staging
  kubectl buildlock status --target staging -o jsonpath='{.items[0].holder.fencingToken}'`

// statusOptions is `kubectl buildlock status`.
type statusOptions struct {
	f             *factory
	target        string
	allNamespaces bool
	watch         bool
	namespace     string
	print         *genericclioptions.PrintFlags
	printer       printers.ResourcePrinter
}

func newStatusCommand(o *statusOptions) *cobra.Command {
	cmd := newCommand(o, "status [--target T] [-A] [-o FORMAT]",
		"Show who holds each target, with which fencing token, and who waits in which order", statusLong, statusExample)
	cmd.Args = cobra.NoArgs
	addTargetFlag(cmd, o.f, &o.target, "Show only this target.")
	cmd.Flags().BoolVarP(&o.allNamespaces, "all-namespaces", "A", false, "Show the locks of every namespace.")
	cmd.Flags().BoolVarP(&o.watch, "watch", "w", false, "After showing the locks, show them again each time they change, until interrupted.")
	o.print = genericclioptions.NewPrintFlags("")
	addOutputFlags(cmd, o.print, "wide")
	return cmd
}

func (o *statusOptions) Complete(*cobra.Command, []string) error {
	var err error
	if o.printer, err = printerFor(o.print, "wide"); err != nil {
		return err
	}
	if !o.allNamespaces {
		o.namespace, err = o.f.namespace()
	}
	return err
}

func (o *statusOptions) Validate() error { return nil }

func (o *statusOptions) Run(ctx context.Context) error {
	c, err := o.f.client()
	if err != nil {
		return err
	}
	if o.watch {
		return o.runWatch(ctx, c)
	}
	locks, err := lock.Status(ctx, c, o.namespace, o.target, lock.WithErrorHandler(warnOnce(o.f.streams.ErrOut)))
	if err != nil {
		return err
	}
	return o.show(locks)
}

// show prints locks in the output format asked for.
func (o *statusOptions) show(locks []lock.Summary) error {
	out := o.f.streams.Out
	switch {
	case *o.print.OutputFormat == "name":
		claims := holdersAndQueues(locks)
		if len(claims) == 0 {
			// As kubectl get -o name says that it found nothing.
			fmt.Fprintf(o.f.streams.ErrOut, "No BuildLocks hold or wait %s.\n", o.where())
		}
		for _, bl := range claims {
			if err := o.printer.PrintObj(bl, out); err != nil {
				return err
			}
		}
		return nil
	case o.printer != nil:
		return o.printer.PrintObj(&lockStatusList{TypeMeta: lockStatusListType, Items: locks}, out)
	case len(locks) == 0:
		fmt.Fprintf(o.f.streams.ErrOut, "No BuildLocks found %s.\n", o.where())
		return nil
	}
	// A frozen target first: it explains every waiting claim below.
	for _, l := range locks {
		if l.Frozen != "" {
			fmt.Fprintf(out, "%s%s: no claim is granted but through an override (kubectl buildlock override).\n", namespacePrefix(l, o.allNamespaces), l.Frozen)
		}
	}
	if err := printTable(out, locks, o.allNamespaces, *o.print.OutputFormat == "wide", time.Now()); err != nil {
		return err
	}
	return printAudit(out, locks, o.allNamespaces)
}

// where says where status looked: "in namespace ci" (on target staging).
func (o *statusOptions) where() string {
	where := "in namespace " + o.namespace
	if o.allNamespaces {
		where = "in any namespace"
	}
	if o.target != "" {
		where = "on " + o.target + " " + where
	}
	return where
}

// printAudit prints the locks' audits, newest first, under a heading:
// TARGET, AT, WHAT (ForceRelease, Rollback, Override), NAME, BUILD, TOKEN,
// BY (as the API server verified them; <unverified> when nothing did) and
// WHY; NAMESPACE first for all namespaces. Nothing when no lock has one.
func printAudit(w io.Writer, locks []lock.Summary, withNamespace bool) error {
	table := &metav1.Table{}
	for _, name := range []string{"Namespace", "Target", "At", "What", "Name", "Build", "Token", "By", "Why"} {
		table.ColumnDefinitions = append(table.ColumnDefinitions, metav1.TableColumnDefinition{Name: name})
	}
	if !withNamespace {
		table.ColumnDefinitions = table.ColumnDefinitions[1:]
	}
	for _, l := range locks {
		for k := len(l.Audit) - 1; k >= 0; k-- {
			e := l.Audit[k]
			build := buildOf(&lock.ClaimSummary{Repo: e.Repo, Branch: e.Branch, Workflow: e.Workflow, Build: e.Build})
			switch {
			case e.Kind == buildlockv1.AuditRollback && e.From != 0:
				build += fmt.Sprintf(" (from #%d)", e.From)
			case e.Kind == buildlockv1.AuditOverride && e.Owner != "":
				build += " (line of " + e.Owner + ")"
			}
			cells := []any{l.Namespace, l.Target, e.At.UTC().Format(time.RFC3339), e.Kind, e.Name, build,
				strconv.FormatInt(e.Token, 10), cmp.Or(e.By, "<unverified>"), strconv.Quote(e.Reason)}
			if !withNamespace {
				cells = cells[1:]
			}
			table.Rows = append(table.Rows, metav1.TableRow{Cells: cells})
		}
	}
	if len(table.Rows) == 0 {
		return nil
	}
	fmt.Fprintln(w, "\nForce-releases, rollbacks and overrides, newest first (the grant record keeps the last few):")
	return printers.NewTablePrinter(printers.PrintOptions{}).PrintObj(table, w)
}

// namespacePrefix is "<namespace>/" when status shows every namespace.
func namespacePrefix(l lock.Summary, all bool) string {
	if all {
		return l.Namespace + "/"
	}
	return ""
}

// lockStatusList is what status prints with -o json, yaml, jsonpath and
// go-template: pkg/lock's summaries in a list object, as kubectl's printers
// want one. It is the plugin's output, not a resource the API serves.
type lockStatusList struct {
	metav1.TypeMeta `json:",inline"`
	Items           []lock.Summary `json:"items"`
}

var lockStatusListType = metav1.TypeMeta{APIVersion: buildlockv1.GroupVersion.String(), Kind: "LockStatusList"}

// DeepCopyObject makes lockStatusList a runtime.Object.
func (l *lockStatusList) DeepCopyObject() runtime.Object {
	c := *l
	c.Items = slices.Clone(l.Items)
	return &c
}

// holdersAndQueues are the BuildLocks that hold and wait, lock by lock, each
// holder before its queue in order, for -o name.
func holdersAndQueues(locks []lock.Summary) []*buildlockv1.BuildLock {
	var out []*buildlockv1.BuildLock
	for _, l := range locks {
		for _, c := range slices.Concat(asSlice(l.Holder), l.Queue) {
			bl := &buildlockv1.BuildLock{ObjectMeta: metav1.ObjectMeta{Namespace: l.Namespace, Name: c.Name}}
			bl.SetGroupVersionKind(buildlockv1.GroupVersion.WithKind("BuildLock"))
			out = append(out, bl)
		}
	}
	return out
}

// asSlice is the claim pointed to, if any, as a slice.
func asSlice(c *lock.ClaimSummary) []lock.ClaimSummary {
	if c == nil {
		return nil
	}
	return []lock.ClaimSummary{*c}
}

// printTable prints, with kubectl's table printer, a row for each lock's
// holder and one for each claim in its queue: TARGET, ORDERING, PLACE
// (holder, 1 (next), 2, ...), BUILD, PHASE, TOKEN and AGE (how long it has
// held or waited), NAMESPACE first for all namespaces; wide adds NAME, POD
// and MESSAGE.
func printTable(w io.Writer, locks []lock.Summary, withNamespace, wide bool, now time.Time) error {
	table := &metav1.Table{}
	for _, name := range []string{"Namespace", "Target", "Ordering", "Place", "Build", "Phase", "Token", "Age", "Name", "Pod", "Message"} {
		table.ColumnDefinitions = append(table.ColumnDefinitions, metav1.TableColumnDefinition{Name: name})
	}
	for i := range table.ColumnDefinitions[8:] {
		table.ColumnDefinitions[8+i].Priority = 1 // wide only
	}
	if !withNamespace {
		table.ColumnDefinitions = table.ColumnDefinitions[1:]
	}
	for _, l := range locks {
		row := func(place string, c *lock.ClaimSummary) {
			cells := []any{l.Namespace, l.Target, cmp.Or(string(l.Ordering), "<unknown>"), place, "<none>", "", "", "", "", "", ""}
			if c != nil {
				since := c.QueuedAt
				if c.Phase == buildlockv1.PhaseHeld {
					since = c.AcquiredAt
				}
				cells[4], cells[5], cells[7], cells[8], cells[9], cells[10] = buildOf(c), string(c.Phase), age(since, c.Created, now), c.Name, c.Pod, c.Message
				if c.FencingToken != 0 {
					cells[6] = strconv.FormatInt(c.FencingToken, 10)
				}
			}
			if !withNamespace {
				cells = cells[1:]
			}
			table.Rows = append(table.Rows, metav1.TableRow{Cells: cells})
		}
		switch {
		case l.Holder != nil:
			row("holder", l.Holder)
		case len(l.Queue) == 0:
			row("-", nil)
		}
		for i := range l.Queue {
			place := strconv.Itoa(i + 1)
			if i == 0 {
				place += " (next)"
			}
			row(place, &l.Queue[i])
		}
	}
	return printers.NewTablePrinter(printers.PrintOptions{Wide: wide}).PrintObj(table, w)
}

// age is how long ago since was (else created), as kubectl prints ages.
func age(since *metav1.MicroTime, created metav1.Time, now time.Time) string {
	t := created.Time
	if since != nil {
		t = since.Time
	}
	return duration.HumanDuration(now.Sub(t))
}

// buildOf names a claim's build: acme/shop@main #42, and the last part of
// its workflow for a claim of one: acme/shop@main #12 (hotfix.yml).
func buildOf(c *lock.ClaimSummary) string {
	s := fmt.Sprintf("%s@%s #%d", c.Repo, c.Branch, c.Build)
	if c.Workflow != "" {
		s += " (" + path.Base(c.Workflow) + ")"
	}
	if c.Rollback != nil {
		s += " rollback"
	}
	return s
}

// describeLock says who holds a lock and how many wait, for completions.
func describeLock(l lock.Summary) string {
	holder := "free"
	if l.Holder != nil {
		holder = "held by " + buildOf(l.Holder)
	}
	return fmt.Sprintf("%s, %d waiting (%s)", holder, len(l.Queue), l.Ordering)
}

// phaseLine is how acquire reports a claim's phase and message: the
// message alone when it starts with the phase already ("Waiting for build
// 42 of acme/shop@main to release staging."), else "Phase: message"
// ("Waiting: staging is frozen until ..."), or the phase alone.
func phaseLine(phase buildlockv1.Phase, message string) string {
	switch {
	case message == "":
		return string(phase)
	case strings.HasPrefix(message, string(phase)+" "):
		return message
	}
	return string(phase) + ": " + message
}
