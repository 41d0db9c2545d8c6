package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"text/tabwriter"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/duration"
	"sigs.k8s.io/yaml"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
)

// lockStatus is one lock (a namespace and a target) as `status` shows it.
type lockStatus struct {
	Namespace string `json:"namespace"`
	Target    string `json:"target"`
	// Holder and Waiting are the claims in phase Held and Waiting, if any.
	Holder  *claimStatus `json:"holder,omitempty"`
	Waiting *claimStatus `json:"waiting,omitempty"`
	// Claims are all the lock's claims, the finished ones included, newest
	// first.
	Claims []claimStatus `json:"claims"`
}

// claimStatus is one claim as `status` shows it.
type claimStatus struct {
	Name         string                 `json:"name"`
	Repo         string                 `json:"repo"`
	Branch       string                 `json:"branch"`
	Build        int64                  `json:"build"`
	Pod          string                 `json:"pod,omitempty"`
	Phase        buildlockv1.Phase      `json:"phase"`
	Reason       string                 `json:"reason,omitempty"`
	Message      string                 `json:"message,omitempty"`
	FencingToken int64                  `json:"fencingToken,omitempty"`
	Created      metav1.Time            `json:"created"`
	AcquiredAt   *metav1.MicroTime      `json:"acquiredAt,omitempty"`
	ExpiresAt    *metav1.MicroTime      `json:"expiresAt,omitempty"`
	SupersededBy string                 `json:"supersededBy,omitempty"`
	Timestamp    *buildlockv1.Timestamp `json:"timestamp,omitempty"`
	ExpiresAfter *metav1.Duration       `json:"expiresAfter,omitempty"`
	RenewTime    *buildlockv1.Timestamp `json:"renewTime,omitempty"`
}

func (a *app) status(ctx context.Context, args []string) int {
	o, err := parseStatus(args)
	if errors.Is(err, errHelp) {
		fmt.Fprint(a.stdout, commandHelp["status"])
		return exitOK
	}
	if err != nil {
		return a.usageError("status", err)
	}
	kc, err := a.connect(o.kube)
	if err != nil {
		return a.fail(err)
	}
	namespace := kc.Namespace
	if o.allNamespaces {
		namespace = ""
	}
	claims, err := listTarget(ctx, kc, namespace, o.target)
	if err != nil {
		return a.fail(err)
	}
	locks := summarize(claims)
	switch o.output {
	case "json":
		data, err := json.MarshalIndent(map[string]any{"locks": locks}, "", "  ")
		if err != nil {
			return a.fail(fmt.Errorf("encoding JSON: %w", err))
		}
		fmt.Fprintln(a.stdout, string(data))
	case "yaml":
		data, err := yaml.Marshal(map[string]any{"locks": locks})
		if err != nil {
			return a.fail(fmt.Errorf("encoding YAML: %w", err))
		}
		fmt.Fprint(a.stdout, string(data))
	default:
		if len(locks) == 0 {
			where := "in namespace " + kc.Namespace
			if o.allNamespaces {
				where = "in any namespace"
			}
			fmt.Fprintf(a.stderr, "No BuildLocks found %s.\n", where)
			return exitOK
		}
		printTable(a.stdout, locks, o.allNamespaces, time.Now())
	}
	return exitOK
}

// summarize groups claims by lock, sorted by namespace and target, with each
// lock's claims newest first.
func summarize(claims []buildlockv1.BuildLock) []lockStatus {
	byLock := map[[2]string]*lockStatus{}
	for i := range claims {
		bl := &claims[i]
		key := [2]string{bl.Namespace, bl.Spec.Target}
		ls := byLock[key]
		if ls == nil {
			ls = &lockStatus{Namespace: bl.Namespace, Target: bl.Spec.Target}
			byLock[key] = ls
		}
		ls.Claims = append(ls.Claims, claimOf(bl))
	}
	locks := make([]lockStatus, 0, len(byLock))
	for _, ls := range byLock {
		slices.SortFunc(ls.Claims, func(a, b claimStatus) int {
			if c := b.Created.Compare(a.Created.Time); c != 0 {
				return c
			}
			return cmp.Compare(a.Name, b.Name)
		})
		for i := range ls.Claims {
			c := &ls.Claims[i]
			switch {
			// Two claims shown Held can only be a moment of a hand-off:
			// the higher token is the newer grant.
			case c.Phase == buildlockv1.PhaseHeld && (ls.Holder == nil || c.FencingToken > ls.Holder.FencingToken):
				ls.Holder = c
			case c.Phase == buildlockv1.PhaseWaiting && ls.Waiting == nil:
				ls.Waiting = c
			}
		}
		locks = append(locks, *ls)
	}
	slices.SortFunc(locks, func(a, b lockStatus) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Target, b.Target))
	})
	return locks
}

func claimOf(bl *buildlockv1.BuildLock) claimStatus {
	c := claimStatus{
		Name: bl.Name, Repo: bl.Spec.Repo, Branch: bl.Spec.Branch, Build: bl.Spec.Build,
		Phase: bl.Status.Phase, Reason: bl.Status.Reason, Message: bl.Status.Message,
		FencingToken: bl.Status.FencingToken, Created: bl.CreationTimestamp,
		AcquiredAt: bl.Status.AcquiredAt, ExpiresAt: bl.Status.ExpiresAt, SupersededBy: bl.Status.SupersededBy,
		Timestamp: bl.Spec.Timestamp, ExpiresAfter: bl.Spec.ExpiresAfter, RenewTime: bl.Spec.RenewTime,
	}
	if c.Phase == "" {
		c.Phase = buildlockv1.PhasePending
	}
	if bl.Spec.PodRef != nil {
		c.Pod = bl.Spec.PodRef.Name
	}
	return c
}

// printTable writes TARGET, HOLDER (build and how long it holds), WAITING
// and TOKEN, with NAMESPACE first for all namespaces.
func printTable(w io.Writer, locks []lockStatus, withNamespace bool, now time.Time) {
	tw := tabwriter.NewWriter(w, 0, 8, 3, ' ', 0)
	if withNamespace {
		fmt.Fprint(tw, "NAMESPACE\t")
	}
	fmt.Fprintln(tw, "TARGET\tHOLDER\tWAITING\tTOKEN")
	for _, ls := range locks {
		holder, waiting, token := "<none>", "<none>", "-"
		if h := ls.Holder; h != nil {
			holder = buildOf(h)
			if h.AcquiredAt != nil {
				holder += " (" + duration.HumanDuration(now.Sub(h.AcquiredAt.Time)) + ")"
			}
			token = fmt.Sprint(h.FencingToken)
		}
		if ls.Waiting != nil {
			waiting = buildOf(ls.Waiting)
		}
		if withNamespace {
			fmt.Fprintf(tw, "%s\t", ls.Namespace)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", ls.Target, holder, waiting, token)
	}
	_ = tw.Flush()
}

// buildOf names a claim's build: acme/shop@main #42.
func buildOf(c *claimStatus) string {
	return fmt.Sprintf("%s@%s #%d", c.Repo, c.Branch, c.Build)
}
