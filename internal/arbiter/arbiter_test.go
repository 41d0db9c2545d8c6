package arbiter

import (
	"strings"
	"testing"
	"time"
)

// Lines used by the scenarios.
const (
	shop    = "acme/shop@main"
	shopDev = "acme/shop@dev"
	web     = "acme/web@main"
)

// Claims used by the scenarios: web-5 usually holds (acquired at minute 30,
// token 7), the others arrive. Minutes are ordering times.
var (
	web5   = claim("web-5", web, 5, 20)
	shop41 = claim("shop-41", shop, 41, 12)
	shop42 = claim("shop-42", shop, 42, 15)
	shop43 = claim("shop-43", shop, 43, 10)
	dev7   = claim("dev-7", shopDev, 7, 15)

	webHolds = grantTo(web5, 7, 30)
)

// decideCase is one scenario: the input (now defaults to minute 60) and the
// expected verdict of every claim, as printed by short.
type decideCase struct {
	claims []Claim
	grant  Grant
	now    time.Time
	policy Policy

	want         map[string]string
	holder       string
	waiting      string
	grantChanged bool
	token        int64
}

func (tc decideCase) input() input {
	now := tc.now
	if now.IsZero() {
		now = at(60)
	}
	return input{claims: tc.claims, grant: tc.grant, now: now, policy: tc.policy}
}

func runDecideCases(t *testing.T, cases map[string]decideCase) {
	t.Helper()
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			in := tc.input()
			d := in.decide()
			if len(tc.want) != len(tc.claims) {
				t.Fatalf("the case expects %d verdicts for %d claims", len(tc.want), len(tc.claims))
			}
			for claimName, want := range tc.want {
				if got := short(verdictOf(d, claimName)); got != want {
					t.Errorf("%s: got %q, want %q", claimName, got, want)
				}
			}
			if d.Holder != tc.holder || d.Waiting != tc.waiting {
				t.Errorf("holder=%q waiting=%q, want holder=%q waiting=%q", d.Holder, d.Waiting, tc.holder, tc.waiting)
			}
			if d.GrantChanged != tc.grantChanged || d.Grant.Token != tc.token {
				t.Errorf("grantChanged=%v token=%d, want grantChanged=%v token=%d",
					d.GrantChanged, d.Grant.Token, tc.grantChanged, tc.token)
			}
			if err := checkInvariants(in, d); err != nil {
				t.Error(err)
			}
			if t.Failed() {
				t.Logf("decision:\n%s", d)
			}
		})
	}
}

// TestOriginalScenarios has a counterpart for every scenario of Jenkins X's
// build lock (reference/build_lock.go.txt).
func TestOriginalScenarios(t *testing.T) {
	runDecideCases(t, map[string]decideCase{
		"the same holder and waiter decided again change nothing": {
			claims: []Claim{held(web5, 7), waiting(shop42)},
			grant:  webHolds,
			want:   map[string]string{"web-5": "Held Acquired", "shop-42": "Waiting WaitingForHolder"},
			holder: "web-5", waiting: "shop-42", token: 7,
		},
		"another claim on the holder's very build is a duplicate": {
			claims: []Claim{held(web5, 7), claim("web-5-retry", web, 5, 40)},
			grant:  webHolds,
			want: map[string]string{
				"web-5": "Held Acquired", "web-5-retry": "Superseded DuplicateBuild by=web-5",
			},
			holder: "web-5", token: 7,
		},
		"another claim on the waiting build is a duplicate": {
			claims: []Claim{held(web5, 7), waiting(shop42), claim("shop-42-retry", shop, 42, 50)},
			grant:  webHolds,
			want: map[string]string{
				"web-5": "Held Acquired", "shop-42": "Waiting WaitingForHolder",
				"shop-42-retry": "Superseded DuplicateBuild by=shop-42",
			},
			holder: "web-5", waiting: "shop-42", token: 7,
		},
		"a lower build of the holder's line gives up": {
			claims: []Claim{held(web5, 7), claim("web-4", web, 4, 50)},
			grant:  webHolds,
			want: map[string]string{
				"web-5": "Held Acquired", "web-4": "Superseded SupersededByNewerBuild by=web-5",
			},
			holder: "web-5", token: 7,
		},
		"a lower build than the waiting one of its line gives up": {
			claims: []Claim{held(web5, 7), waiting(shop42), shop41},
			grant:  webHolds,
			want: map[string]string{
				"web-5": "Held Acquired", "shop-42": "Waiting WaitingForHolder",
				"shop-41": "Superseded SupersededByNewerBuild by=shop-42",
			},
			holder: "web-5", waiting: "shop-42", token: 7,
		},
		"a higher build of the holder's line waits": {
			claims: []Claim{held(web5, 7), claim("web-6", web, 6, 50)},
			grant:  webHolds,
			want:   map[string]string{"web-5": "Held Acquired", "web-6": "Waiting WaitingForHolder"},
			holder: "web-5", waiting: "web-6", token: 7,
		},
		"a higher build with an older timestamp still wins its line": {
			claims: []Claim{held(web5, 7), waiting(shop42), shop43}, // shop-43 is ordered at 10, shop-42 at 15
			grant:  webHolds,
			want: map[string]string{
				"web-5": "Held Acquired", "shop-43": "Waiting WaitingForHolder",
				"shop-42": "Superseded SupersededByNewerBuild by=shop-43",
			},
			holder: "web-5", waiting: "shop-43", token: 7,
		},
		"another line with the same timestamp as the waiting claim gives up": {
			claims: []Claim{held(web5, 7), waiting(shop42), dev7}, // both at 15; "dev-7" sorts first by name
			grant:  webHolds,
			want: map[string]string{
				"web-5": "Held Acquired", "shop-42": "Waiting WaitingForHolder",
				"dev-7": "Superseded SupersededByNewerBuild by=shop-42",
			},
			holder: "web-5", waiting: "shop-42", token: 7,
		},
		"another line older than the waiting claim gives up": {
			claims: []Claim{held(web5, 7), waiting(shop42), claim("dev-7", shopDev, 7, 14)},
			grant:  webHolds,
			want: map[string]string{
				"web-5": "Held Acquired", "shop-42": "Waiting WaitingForHolder",
				"dev-7": "Superseded SupersededByNewerBuild by=shop-42",
			},
			holder: "web-5", waiting: "shop-42", token: 7,
		},
		"another line newer than the waiting claim takes the slot": {
			claims: []Claim{held(web5, 7), waiting(shop42), claim("dev-7", shopDev, 7, 16)},
			grant:  webHolds,
			want: map[string]string{
				"web-5": "Held Acquired", "dev-7": "Waiting WaitingForHolder",
				"shop-42": "Superseded SupersededByNewerBuild by=dev-7",
			},
			holder: "web-5", waiting: "dev-7", token: 7,
		},
		"another line older than the holder waits when the slot is free, never superseded by the holder": {
			claims: []Claim{held(web5, 7), claim("shop-42", shop, 42, 1)}, // web-5 is ordered at 20
			grant:  webHolds,
			want:   map[string]string{"web-5": "Held Acquired", "shop-42": "Waiting WaitingForHolder"},
			holder: "web-5", waiting: "shop-42", token: 7,
		},
		"the waiter acquires with the next token when the holder's pod is deleted": {
			claims: []Claim{withPod(held(web5, 7), PodGone), waiting(shop42)},
			grant:  webHolds,
			want:   map[string]string{"web-5": "Released PodGone", "shop-42": "Held Acquired"},
			holder: "shop-42", grantChanged: true, token: 8,
		},
		"a force-released holder ends and the waiter acquires with the next token": {
			claims: []Claim{forceReleased(held(web5, 7)), waiting(shop42)},
			grant:  webHolds,
			want:   map[string]string{"web-5": "Released ForceReleased", "shop-42": "Held Acquired"},
			holder: "shop-42", grantChanged: true, token: 8,
		},
		"a force-released waiter leaves the queue and frees the slot": {
			claims: []Claim{held(web5, 7), forceReleased(waiting(shop42))},
			grant:  webHolds,
			want:   map[string]string{"web-5": "Held Acquired", "shop-42": "Released ForceReleased"},
			holder: "web-5", token: 7,
		},
		"the waiter acquires with the next token when the holder's pod succeeded": {
			claims: []Claim{withPod(held(web5, 7), PodFinished), waiting(shop42)},
			grant:  webHolds,
			want:   map[string]string{"web-5": "Released PodFinished", "shop-42": "Held Acquired"},
			holder: "shop-42", grantChanged: true, token: 8,
		},
		// The controller reports Succeeded and Failed alike as PodFinished.
		"the waiter acquires with the next token when the holder's pod failed": {
			claims: []Claim{withPod(held(web5, 7), PodFinished), waiting(shop42), claim("dev-7", shopDev, 7, 1)},
			grant:  webHolds,
			want: map[string]string{
				"web-5": "Released PodFinished", "shop-42": "Held Acquired", "dev-7": "Waiting WaitingForHolder",
			},
			holder: "shop-42", waiting: "dev-7", grantChanged: true, token: 8,
		},
		"the waiter acquires with the next token when a pod-less holder expires": {
			claims: []Claim{podless(held(web5, 7), 10*time.Minute), waiting(shop42)},
			grant:  webHolds,
			now:    at(40), // acquired at 30, plus 10 minutes
			want:   map[string]string{"web-5": "Expired Expired", "shop-42": "Held Acquired"},
			holder: "shop-42", grantChanged: true, token: 8,
		},
		"a higher build appearing while one waits supersedes the waiter": {
			claims: []Claim{held(web5, 7), waiting(shop42), claim("shop-43", shop, 43, 50)},
			grant:  webHolds,
			want: map[string]string{
				"web-5": "Held Acquired", "shop-43": "Waiting WaitingForHolder",
				"shop-42": "Superseded SupersededByNewerBuild by=shop-43",
			},
			holder: "web-5", waiting: "shop-43", token: 7,
		},
	})
}

// TestRules has a scenario for each rule of the package comment beyond the
// original's.
func TestRules(t *testing.T) {
	runDecideCases(t, map[string]decideCase{
		// Rule 7: terminal is terminal.
		"terminal claims never change, whatever their pods": {
			claims: []Claim{
				held(web5, 7),
				inPhase(claim("web-4", web, 4, 1), Superseded),
				withPod(inPhase(shop41, Released), PodGone),
				podless(inPhase(claim("dev-6", shopDev, 6, 50), Expired), 0),
			},
			grant: webHolds,
			want: map[string]string{
				"web-5": "Held Acquired", "web-4": "Superseded (unchanged)",
				"shop-41": "Released (unchanged)", "dev-6": "Expired (unchanged)",
			},
			holder: "web-5", token: 7,
		},
		"a grant naming a terminal claim is a free lock": {
			claims: []Claim{inPhase(web5, Released), shop42},
			grant:  webHolds,
			want:   map[string]string{"web-5": "Released (unchanged)", "shop-42": "Held Acquired"},
			holder: "shop-42", grantChanged: true, token: 8,
		},
		// Rule 2: no pre-emption.
		"a newer build never pre-empts a live holder": {
			claims: []Claim{held(web5, 7), claim("shop-99", shop, 99, 59), claim("web-9", web, 9, 59)},
			grant:  webHolds,
			want: map[string]string{
				"web-5": "Held Acquired", "shop-99": "Waiting WaitingForHolder",
				"web-9": "Superseded SupersededByNewerBuild by=shop-99",
			},
			holder: "web-5", waiting: "shop-99", token: 7,
		},
		"a pod-less holder renewed in time keeps the lock": {
			claims: []Claim{func() Claim {
				c := podless(held(web5, 7), 10*time.Minute)
				c.RenewTime = at(45)
				return c
			}()},
			grant:  webHolds,
			now:    at(50), // acquired at 30: past 10 minutes, but renewed at 45
			want:   map[string]string{"web-5": "Held Acquired"},
			holder: "web-5", token: 7,
		},
		"a pod-less holder without expiresAfter keeps the lock for the default hour": {
			claims: []Claim{podless(held(web5, 7), 0)},
			grant:  webHolds,
			now:    at(89),
			want:   map[string]string{"web-5": "Held Acquired"},
			holder: "web-5", token: 7,
		},
		"a pod-backed holder expires at the max hold and the waiter acquires": {
			claims: []Claim{held(web5, 7), waiting(shop42)},
			grant:  webHolds,
			now:    at(90),
			policy: Policy{MaxHold: time.Hour},
			want:   map[string]string{"web-5": "Expired MaxHoldExceeded", "shop-42": "Held Acquired"},
			holder: "shop-42", grantChanged: true, token: 8,
		},
		"a max hold bounds a pod-less holder too, however it renews": {
			claims: []Claim{renewedAt(podless(held(web5, 7), 2*time.Hour), 85), waiting(shop42)},
			grant:  webHolds,
			now:    at(90),
			policy: Policy{MaxHold: time.Hour},
			want:   map[string]string{"web-5": "Expired MaxHoldExceeded", "shop-42": "Held Acquired"},
			holder: "shop-42", grantChanged: true, token: 8,
		},
		"a renewal in the future counts from now, not from the client's clock": {
			claims: []Claim{renewing(podless(held(web5, 7), 10*time.Minute), 9999*24*60), waiting(shop42)},
			grant:  webHolds,
			now:    at(35),
			want:   map[string]string{"web-5": "Held Acquired", "shop-42": "Waiting WaitingForHolder"},
			holder: "web-5", waiting: "shop-42", token: 7,
		},
		"a renewal recorded at its observation ends the hold expiresAfter later": {
			claims: []Claim{renewedAt(podless(held(web5, 7), 10*time.Minute), 35), waiting(shop42)},
			grant:  webHolds,
			now:    at(45),
			want:   map[string]string{"web-5": "Expired Expired", "shop-42": "Held Acquired"},
			holder: "shop-42", grantChanged: true, token: 8,
		},
		"the waiter acquires when the holder's BuildLock was deleted": {
			claims: []Claim{waiting(shop42)},
			grant:  webHolds,
			want:   map[string]string{"shop-42": "Held Acquired"},
			holder: "shop-42", grantChanged: true, token: 8,
		},
		"a claim recreated under the holder's name is not the holder": {
			claims: []Claim{shop42, claim("web-5", web, 5, 50)},
			grant:  Grant{Holder: "web-5", HolderUID: "uid-of-the-deleted-one", Token: 7, AcquiredAt: at(30)},
			want:   map[string]string{"web-5": "Held Acquired", "shop-42": "Waiting WaitingForHolder"},
			holder: "web-5", waiting: "shop-42", grantChanged: true, token: 8,
		},
		"the lock is freed, keeping its token, when the holder ends and nothing waits": {
			claims:       []Claim{withPod(held(web5, 7), PodFinished)},
			grant:        webHolds,
			want:         map[string]string{"web-5": "Released PodFinished"},
			grantChanged: true, token: 7,
		},
		"the grant is left alone when its holder's status is not written yet": {
			claims: []Claim{waiting(web5)},
			grant:  webHolds,
			want:   map[string]string{"web-5": "Held Acquired"},
			holder: "web-5", token: 7,
		},
		"a grant whose holder's status is not written yet can still end": {
			claims: []Claim{withPod(waiting(web5), PodGone), shop42},
			grant:  webHolds,
			want:   map[string]string{"web-5": "Released PodGone", "shop-42": "Held Acquired"},
			holder: "shop-42", grantChanged: true, token: 8,
		},
		// Rule 1: one holder.
		"a claim shown Held that the grant does not name loses the lock": {
			claims: []Claim{held(web5, 7), held(shop42, 6)},
			grant:  webHolds,
			want:   map[string]string{"web-5": "Held Acquired", "shop-42": "Released LockLost"},
			holder: "web-5", token: 7,
		},
		"a claim shown Held whose pod finished is released as finished, grant or not": {
			claims: []Claim{held(web5, 7), withPod(held(shop42, 6), PodFinished)},
			grant:  webHolds,
			want:   map[string]string{"web-5": "Held Acquired", "shop-42": "Released PodFinished"},
			holder: "web-5", token: 7,
		},
		"a lost grant record restarts tokens above every claim's": {
			claims: []Claim{held(web5, 7), inPhase(claim("shop-40", shop, 40, 1), Released), shop42},
			grant:  Grant{},
			want: map[string]string{
				"web-5": "Released LockLost", "shop-40": "Released (unchanged)", "shop-42": "Held Acquired",
			},
			holder: "shop-42", grantChanged: true, token: 8,
		},
		// Rule 6: a waiter that dies leaves.
		"a waiter whose pod finished leaves and the next claim takes the slot": {
			claims: []Claim{held(web5, 7), withPod(waiting(shop42), PodFinished), dev7},
			grant:  webHolds,
			want: map[string]string{
				"web-5": "Held Acquired", "shop-42": "Released PodFinished", "dev-7": "Waiting WaitingForHolder",
			},
			holder: "web-5", waiting: "dev-7", token: 7,
		},
		"a pending claim whose pod is gone leaves": {
			claims: []Claim{held(web5, 7), withPod(shop42, PodGone)},
			grant:  webHolds,
			want:   map[string]string{"web-5": "Held Acquired", "shop-42": "Released PodGone"},
			holder: "web-5", token: 7,
		},
		// Rule 3: same line, newer build wins.
		"builds of the holder's line at or below it give up even when a higher one waits": {
			claims: []Claim{
				held(claim("shop-42", shop, 42, 1), 7), shop41, claim("shop-42-retry", shop, 42, 2),
				waiting(shop43), claim("shop-44", shop, 44, 3),
			},
			grant: grantTo(shop42, 7, 30),
			want: map[string]string{
				"shop-42":       "Held Acquired",
				"shop-41":       "Superseded SupersededByNewerBuild by=shop-42",
				"shop-42-retry": "Superseded DuplicateBuild by=shop-42",
				"shop-43":       "Superseded SupersededByNewerBuild by=shop-44",
				"shop-44":       "Waiting WaitingForHolder",
			},
			holder: "shop-42", waiting: "shop-44", token: 7,
		},
		"of equal builds the one already waiting keeps its place": {
			claims: []Claim{held(web5, 7), created(claim("shop-42a", shop, 42, 15), 10), waiting(created(claim("shop-42b", shop, 42, 15), 20))},
			grant:  webHolds,
			want: map[string]string{
				"web-5": "Held Acquired", "shop-42b": "Waiting WaitingForHolder",
				"shop-42a": "Superseded DuplicateBuild by=shop-42b",
			},
			holder: "web-5", waiting: "shop-42b", token: 7,
		},
		"of equal builds the earlier created keeps its place": {
			claims: []Claim{held(web5, 7), created(claim("shop-42a", shop, 42, 15), 20), created(claim("shop-42z", shop, 42, 15), 10)},
			grant:  webHolds,
			want: map[string]string{
				"web-5": "Held Acquired", "shop-42z": "Waiting WaitingForHolder",
				"shop-42a": "Superseded DuplicateBuild by=shop-42z",
			},
			holder: "web-5", waiting: "shop-42z", token: 7,
		},
		"of equal builds created together the smaller name keeps its place": {
			claims: []Claim{held(web5, 7), claim("shop-42z", shop, 42, 15), claim("shop-42a", shop, 42, 15)},
			grant:  webHolds,
			want: map[string]string{
				"web-5": "Held Acquired", "shop-42a": "Waiting WaitingForHolder",
				"shop-42z": "Superseded DuplicateBuild by=shop-42a",
			},
			holder: "web-5", waiting: "shop-42a", token: 7,
		},
		// Rules 4 and 5: the slot and the hand-off.
		"claims of different lines with the same timestamp go by name": {
			claims: []Claim{held(web5, 7), claim("shop-42", shop, 42, 15), claim("dev-7", shopDev, 7, 15)},
			grant:  webHolds,
			want: map[string]string{
				"web-5": "Held Acquired", "dev-7": "Waiting WaitingForHolder",
				"shop-42": "Superseded SupersededByNewerBuild by=dev-7",
			},
			holder: "web-5", waiting: "dev-7", token: 7,
		},
		"a free lock is granted at once": {
			claims: []Claim{shop42},
			want:   map[string]string{"shop-42": "Held Acquired"},
			holder: "shop-42", grantChanged: true, token: 1,
		},
		"a free lock goes to the newest line, the next waits and the rest give up": {
			claims: []Claim{shop42, web5, claim("dev-7", shopDev, 7, 17)}, // ordered at 15, 20, 17
			grant:  Grant{Token: 3},
			want: map[string]string{
				"web-5": "Held Acquired", "dev-7": "Waiting WaitingForHolder",
				"shop-42": "Superseded SupersededByNewerBuild by=dev-7",
			},
			holder: "web-5", waiting: "dev-7", grantChanged: true, token: 4,
		},
		"on hand-off the waiter holds and the newest other claim takes the slot": {
			claims: []Claim{withPod(held(web5, 7), PodGone), waiting(shop42), claim("dev-7", shopDev, 7, 1), claim("web-6", web, 6, 2)},
			grant:  webHolds,
			want: map[string]string{
				"web-5": "Released PodGone", "shop-42": "Held Acquired",
				"web-6": "Waiting WaitingForHolder", "dev-7": "Superseded SupersededByNewerBuild by=web-6",
			},
			holder: "shop-42", waiting: "web-6", grantChanged: true, token: 8,
		},
		// Rule 8: unknown is not dead.
		"a holder and a waiter whose pods are unknown keep their places": {
			claims: []Claim{withPod(held(web5, 7), PodUnknown), withPod(waiting(shop42), PodUnknown)},
			grant:  webHolds,
			want:   map[string]string{"web-5": "Held Acquired", "shop-42": "Waiting WaitingForHolder"},
			holder: "web-5", waiting: "shop-42", token: 7,
		},
		"a holder whose pod is unknown is still bounded by the max hold": {
			claims:       []Claim{withPod(held(web5, 7), PodUnknown)},
			grant:        webHolds,
			now:          at(90),
			policy:       Policy{MaxHold: time.Hour},
			want:         map[string]string{"web-5": "Expired MaxHoldExceeded"},
			grantChanged: true, token: 7,
		},
	})
}

func TestSameClaimDecidedTwiceIsIdempotent(t *testing.T) {
	claims := []Claim{shop42, web5}
	first := Decide(staging, claims, Grant{}, at(60), Policy{})
	second := Decide(staging, first.Apply(claims), first.Grant, at(61), Policy{})
	if second.GrantChanged || second.Holder != first.Holder || second.Waiting != first.Waiting {
		t.Fatalf("second decision differs:\n%s\nthen\n%s", first, second)
	}
	for _, v := range second.Verdicts {
		was := verdictOf(first, v.Name)
		if v.From != was.Phase || v.Phase != was.Phase || v.Reason != was.Reason || v.Message != was.Message {
			t.Errorf("%s changed: %s, then %s", v.Name, was, v)
		}
	}
}

func TestEmptyPhaseCountsAsPending(t *testing.T) {
	c := inPhase(shop42, "")
	d := Decide(staging, []Claim{c}, Grant{}, at(60), Policy{})
	if v := d.Verdicts[0]; v.From != Pending || v.Phase != Held {
		t.Errorf("got %s, want Pending -> Held", v)
	}
}

func TestHeldVerdictsCarryTokenAndExpiry(t *testing.T) {
	c := podless(shop42, 10*time.Minute)
	c.RenewTime = at(65) // a renewal stamped ahead of now counts from now
	d := Decide(staging, []Claim{c}, Grant{Token: 4}, at(60), Policy{})
	v := d.Verdicts[0]
	if v.FencingToken != 5 || !v.ExpiresAt.Equal(at(70)) || !d.NextLook.Equal(at(70)) || !v.RenewedAt.Equal(at(60)) {
		t.Errorf("got %s and next look %s, renewed at %s; want token 5 expiring at %s", v, d.NextLook, v.RenewedAt, at(70))
	}
	c.RenewTime, c.RenewedAt = time.Time{}, at(65) // a renewal recorded later than the grant counts
	if v := Decide(staging, []Claim{c}, Grant{Token: 4}, at(60), Policy{}).Verdicts[0]; !v.ExpiresAt.Equal(at(75)) {
		t.Errorf("got %s, want expiry at %s", v, at(75))
	}
	if v := verdictOf(Decide(staging, []Claim{held(web5, 7), shop42}, webHolds, at(60), Policy{}), "shop-42"); v.FencingToken != 0 || !v.ExpiresAt.IsZero() {
		t.Errorf("a waiting claim got %s", v)
	}
}

func TestMaxHoldWarnsAndExpires(t *testing.T) {
	policy := Policy{MaxHold: 100 * time.Minute} // acquired at 30: warn at 110, expire at 130
	for name, tc := range map[string]struct {
		now      time.Time
		phase    Phase
		warned   bool
		nextLook time.Time
	}{
		"before 80 % there is no warning, and a look at 80 %":        {now: at(109), phase: Held, nextLook: at(110)},
		"at 80 % the holder is warned, and looked at again at 100 %": {now: at(110), phase: Held, warned: true, nextLook: at(130)},
		"just before 100 % the holder is still warned":               {now: at(130).Add(-time.Nanosecond), phase: Held, warned: true, nextLook: at(130)},
		"at 100 % the hold expires":                                  {now: at(130), phase: Expired},
	} {
		t.Run(name, func(t *testing.T) {
			d := Decide(staging, []Claim{held(web5, 7)}, webHolds, tc.now, policy)
			v := d.Verdicts[0]
			if v.Phase != tc.phase || (v.Warning != "") != tc.warned || !d.NextLook.Equal(tc.nextLook) {
				t.Errorf("got %s, next look %s; want %s warned=%v next look %s", v, d.NextLook, tc.phase, tc.warned, tc.nextLook)
			}
		})
	}
}

func TestNextLook(t *testing.T) {
	for name, tc := range map[string]struct {
		claims []Claim
		grant  Grant
		policy Policy
		want   time.Time
	}{
		"a pod-less holder is looked at when it expires": {
			claims: []Claim{podless(held(web5, 7), 45*time.Minute)}, grant: webHolds, want: at(75),
		},
		"a pod-backed holder without max hold needs no look": {
			claims: []Claim{held(web5, 7), waiting(shop42)}, grant: webHolds,
		},
		"a newly granted pod-backed holder is looked at at 80 % of the max hold": {
			claims: []Claim{shop42}, policy: Policy{MaxHold: 10 * time.Minute}, want: at(68),
		},
		"a newly granted pod-less holder is looked at when it expires": {
			claims: []Claim{podless(shop42, 5*time.Minute)}, want: at(65),
		},
		"a free lock needs no look": {},
	} {
		t.Run(name, func(t *testing.T) {
			if d := Decide(staging, tc.claims, tc.grant, at(60), tc.policy); !d.NextLook.Equal(tc.want) {
				t.Errorf("next look %s, want %s\n%s", d.NextLook, tc.want, d)
			}
		})
	}
}

func TestVerdictsAreInWritingOrder(t *testing.T) {
	claims := []Claim{
		claim("a-new", "acme/a@main", 1, 1),
		withPod(held(web5, 7), PodFinished),
		waiting(shop42),
		held(claim("b-stale", "acme/b@main", 1, 1), 2),
		inPhase(claim("c-done", "acme/c@main", 1, 1), Released),
	}
	d := Decide(staging, claims, webHolds, at(60), Policy{})
	var names []string
	for _, v := range d.Verdicts {
		names = append(names, v.Name)
	}
	got, want := strings.Join(names, " "), "b-stale web-5 a-new c-done shop-42"
	if got != want {
		t.Errorf("writing order %q, want %q (stop holding, the rest by name, the new holder last)\n%s", got, want, d)
	}
}

func TestMessages(t *testing.T) {
	tenMinutes := podless(held(web5, 7), 10*time.Minute)
	for name, tc := range map[string]struct {
		claims []Claim
		grant  Grant
		now    time.Time
		policy Policy
		claim  string
		want   string
		warn   string
	}{
		"a holder is told its token": {
			claims: []Claim{held(web5, 7)}, grant: webHolds, claim: "web-5",
			want: "Holding staging with fencing token 7; deploy now and delete this BuildLock when done.",
		},
		"a pod-less holder is told its expiry": {
			claims: []Claim{tenMinutes}, grant: webHolds, now: at(35), claim: "web-5",
			want: "Holding staging with fencing token 7 until 2026-03-02T09:40:00Z unless spec.renewTime is bumped; " +
				"deploy now and delete this BuildLock when done.",
		},
		"a waiter is told whom it waits for": {
			claims: []Claim{held(web5, 7), shop42}, grant: webHolds, claim: "shop-42",
			want: "Waiting for build 5 of acme/web@main to release staging.",
		},
		"a build superseded by one that waits is told so": {
			claims: []Claim{held(web5, 7), waiting(shop42), shop43}, grant: webHolds, claim: "shop-42",
			want: "Build 43 of acme/shop@main is newer and waits for staging: it deploys instead, and this build will not. Stop this pipeline.",
		},
		"a build superseded by the holder is told so": {
			claims: []Claim{held(web5, 7), claim("web-4", web, 4, 1)}, grant: webHolds, claim: "web-4",
			want: "Build 5 of acme/web@main is newer and holds staging: it deploys instead, and this build will not. Stop this pipeline.",
		},
		"a build superseded by one that lost the slot in turn is told which build goes instead": {
			claims: []Claim{held(web5, 7), shop42, shop43, claim("dev-7", shopDev, 7, 50)}, grant: webHolds, claim: "shop-42",
			want: "Build 43 of acme/shop@main is newer, and gave way in turn to build 7 of acme/shop@dev, which waits for staging: " +
				"this build will not deploy either. Stop this pipeline.",
		},
		"a run of the holder's build is told that another run of it holds, and when to re-run": {
			claims: []Claim{held(web5, 7), claim("web-5-retry", web, 5, 40)}, grant: webHolds, claim: "web-5-retry",
			want: "Build 5 of acme/web@main holds staging as BuildLock web-5, another run of the same build: two runs of one build " +
				"never deploy at once, so this one will not. Stop this run; re-run it once that one has ended, if it must deploy again.",
		},
		"a holder whose pod finished is released": {
			claims: []Claim{withPod(held(web5, 7), PodFinished)}, grant: webHolds, claim: "web-5",
			want: "The pod of build 5 of acme/web@main finished; its hold on staging is released.",
		},
		"a waiter whose pod is gone leaves the queue": {
			claims: []Claim{held(web5, 7), withPod(waiting(shop42), PodGone)}, grant: webHolds, claim: "shop-42",
			want: "The pod of build 42 of acme/shop@main is gone; it leaves the queue for staging.",
		},
		"a lost hold is told to stop": {
			claims: []Claim{held(shop42, 3)}, claim: "shop-42",
			want: "The grant record of staging no longer names build 42 of acme/shop@main; stop deploying, " +
				"and create a new BuildLock to claim staging again.",
		},
		"an expired pod-less hold is told when it expired": {
			claims: []Claim{tenMinutes}, grant: webHolds, now: at(45), claim: "web-5",
			want: "Build 5 of acme/web@main was not renewed in time: its hold on staging expired at 2026-03-02T09:40:00Z; stop deploying.",
		},
		"a hold past the max hold is told the limit": {
			claims: []Claim{held(web5, 7)}, grant: webHolds, now: at(90), policy: Policy{MaxHold: time.Hour}, claim: "web-5",
			want: "Build 5 of acme/web@main held staging for its maximum hold, until 2026-03-02T10:30:00Z; stop deploying.",
		},
		"a hold near the max hold is warned": {
			claims: []Claim{held(web5, 7)}, grant: webHolds, now: at(80), policy: Policy{MaxHold: time.Hour}, claim: "web-5",
			want: "Holding staging with fencing token 7 until 2026-03-02T10:30:00Z, its maximum hold; deploy now and delete this BuildLock when done.",
			warn: "Build 5 of acme/web@main has held staging for over 80 % of its maximum hold of 1h0m0s; " +
				"the hold expires at 2026-03-02T10:30:00Z.",
		},
		"a force-release names who the API server verified set it, and quotes the annotation": {
			claims: []Claim{verifiedBy(forceReleased(held(web5, 7)), "system:serviceaccount:other:pipeline"), waiting(shop42)},
			grant:  webHolds, claim: "web-5",
			want: `Build 5 of acme/web@main was force-released by "system:serviceaccount:other:pipeline" ` +
				`("alice: stuck deploy"); its hold on staging ends; stop deploying.`,
		},
		"an unverified force-release says so": {
			claims: []Claim{held(web5, 7), forceReleased(waiting(shop42))}, grant: webHolds, claim: "shop-42",
			want: `Build 42 of acme/shop@main was force-released by an unverified requester ("alice: stuck deploy"); ` +
				"it leaves the queue for staging.",
		},
		"a terminal claim keeps its stored message": {
			claims: []Claim{inPhase(shop42, Superseded)}, claim: "shop-42", want: "",
		},
	} {
		t.Run(name, func(t *testing.T) {
			now := tc.now
			if now.IsZero() {
				now = at(60)
			}
			v := verdictOf(Decide(staging, tc.claims, tc.grant, now, tc.policy), tc.claim)
			if v.Message != tc.want {
				t.Errorf("message\n%q\nwant\n%q", v.Message, tc.want)
			}
			if v.Warning != tc.warn {
				t.Errorf("warning\n%q\nwant\n%q", v.Warning, tc.warn)
			}
		})
	}
}

func TestDecisionString(t *testing.T) {
	claims := []Claim{
		withPod(held(web5, 7), PodGone), waiting(podless(shop42, 10*time.Minute)),
		claim("dev-7", shopDev, 7, 1), claim("dev-6", shopDev, 6, 1), inPhase(shop41, Superseded),
	}
	d := Decide(staging, claims, webHolds, at(60), Policy{MaxHold: time.Hour})
	want := `holder="shop-42" waiting="dev-7" queued=1 grant={shop-42/uid-shop-42 token=8 since 2026-03-02T10:00:00Z lines=[acme/shop@main#42 acme/web@main#5] ended=web-5:Released/PodGone} changed nextLook=2026-03-02T10:10:00Z
  web-5: Held -> Released PodGone
  dev-7: Pending -> Waiting WaitingForHolder queuedAt=2026-03-02T10:00:00Z
  dev-6: Pending -> Superseded SupersededByNewerBuild by=dev-7
  shop-41: Superseded (unchanged)
  shop-42: Waiting -> Held Acquired token=8 expiresAt=2026-03-02T10:10:00Z`
	if got := d.String(); got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
	warned := Decide(staging, []Claim{held(web5, 7)}, webHolds, at(80), Policy{MaxHold: time.Hour})
	if got, want := warned.String(), `holder="web-5" waiting="" queued=0 grant={web-5/uid-web-5 token=7 since 2026-03-02T09:30:00Z} nextLook=2026-03-02T10:30:00Z
  web-5: Held -> Held Acquired token=7 expiresAt=2026-03-02T10:30:00Z warning`; got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
	if got, want := (Grant{Token: 3}).String(), "free token=3"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestApply(t *testing.T) {
	stranger := claim("stranger", shop, 1, 1)
	claims := []Claim{withPod(held(web5, 7), PodGone), waiting(shop42)}
	d := Decide(staging, claims, webHolds, at(60), Policy{})
	got := d.Apply(append(claims, stranger))
	if got[0].Phase != Released || got[0].FencingToken != 7 {
		t.Errorf("ended holder became %+v", got[0])
	}
	if got[1].Phase != Held || got[1].FencingToken != 8 {
		t.Errorf("new holder became %+v", got[1])
	}
	if got[2] != stranger {
		t.Errorf("a claim the decision does not know changed: %+v", got[2])
	}
	if claims[1].Phase != Waiting {
		t.Error("Apply modified its input")
	}
}

func TestDecideDoesNotModifyItsInput(t *testing.T) {
	claims := []Claim{inPhase(shop42, ""), withPod(held(web5, 7), PodGone), shop43}
	before := append([]Claim(nil), claims...)
	Decide(staging, claims, webHolds, at(60), Policy{})
	for i := range claims {
		if claims[i] != before[i] {
			t.Errorf("claim %d changed from %+v to %+v", i, before[i], claims[i])
		}
	}
}

func TestPodStateString(t *testing.T) {
	var got []string
	for _, s := range []PodState{NoPod, PodAlive, PodFinished, PodGone, PodUnknown, PodState(9)} {
		got = append(got, s.String())
	}
	if g, want := strings.Join(got, " "), "NoPod PodAlive PodFinished PodGone PodUnknown PodState(9)"; g != want {
		t.Errorf("got %q, want %q", g, want)
	}
}
