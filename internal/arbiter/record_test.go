package arbiter

import (
	"strings"
	"testing"
	"time"
)

// heldSince is c shown Held with token, granted at minute (its status's
// acquiredAt).
func heldSince(c Claim, token int64, minute int) Claim {
	c = held(c, token)
	c.AcquiredAt = at(minute)
	return c
}

// as gives c a verified identity.
func as(c Claim, identity string) Claim { c.Identity = identity; return c }

const (
	shopPipeline = "system:serviceaccount:ci:shop"
	webPipeline  = "system:serviceaccount:ci:web"
	alice        = "alice@example.com"
)

// TestALostOrEditedRecordIsRestored is rule 11 (issue 21, item 4): the
// claims' statuses, which only the operator writes, say which hold is the
// lock's latest, and a grant record that was deleted or edited by hand is
// restored from them instead of ending that hold or repeating a token.
func TestALostOrEditedRecordIsRestored(t *testing.T) {
	holder := heldSince(withWriter(web5, "pod-web-5"), 7, 30)
	waiter := waiting(withWriter(shop42, "pod-shop-42"))
	runDecideCases(t, map[string]decideCase{
		"a deleted record of a live hold is the same hold, written again": {
			claims: []Claim{holder, waiter}, grant: Grant{Absent: true},
			want:   map[string]string{"web-5": "Held Acquired", "shop-42": "Waiting WaitingForHolder"},
			holder: "web-5", waiting: "shop-42", grantChanged: true, token: 7,
		},
		"a deleted record whose hold a later token overtook is not restored": {
			claims: []Claim{holder, waiter}, grant: Grant{Absent: true, Floor: 8},
			want:   map[string]string{"web-5": "Released LockLost", "shop-42": "Held Acquired"},
			holder: "shop-42", grantChanged: true, token: 9,
		},
		"a deleted record and token floor leave the claims' tokens": {
			claims: []Claim{inPhase(heldSince(web5, 3, 10), Released), claim("web-6", web, 6, 50)},
			grant:  Grant{Absent: true},
			want:   map[string]string{"web-5": "Released (unchanged)", "web-6": "Held Acquired"},
			holder: "web-6", grantChanged: true, token: 4,
		},
		"the operator's memory of the token outlives the record and the claims": {
			claims: []Claim{claim("web-6", web, 6, 50)}, grant: Grant{Absent: true, Floor: 3},
			want:   map[string]string{"web-6": "Held Acquired"},
			holder: "web-6", grantChanged: true, token: 4,
		},
		"a deleted record of a live hold below the namespace's reservation is the same hold": {
			claims: []Claim{holder, waiter}, grant: Grant{Absent: true, Reserved: 107},
			want:   map[string]string{"web-5": "Held Acquired", "shop-42": "Waiting WaitingForHolder"},
			holder: "web-5", waiting: "shop-42", grantChanged: true, token: 7,
		},
		"a deleted record with no claim that shows it: the next token is above the reservation": {
			claims: []Claim{claim("web-6", web, 6, 50)}, grant: Grant{Absent: true, Floor: 3, Reserved: 121},
			want:   map[string]string{"web-6": "Held Acquired"},
			holder: "web-6", grantChanged: true, token: 122,
		},
		// Bug 15, with the grant's Held status not written yet: its token
		// lowered by hand and the previous holder's claim gone, nothing
		// shows the token but the line record the grant wrote.
		"a fresh grant whose token was lowered by hand takes back the token its line record carries": {
			claims: []Claim{claim("shop-42", shop, 42, 50)},
			grant: Grant{Holder: "shop-42", HolderUID: "uid-shop-42", Token: 1, AcquiredAt: at(55),
				Lines: []LineRecord{{Repo: "acme/shop", Branch: "main", Build: 42, HeldAt: at(55), Token: 1202}}},
			want:   map[string]string{"shop-42": "Held Acquired"},
			holder: "shop-42", grantChanged: true, token: 1202,
		},
		"a fresh grant's line record of another acquire time says nothing of its token": {
			claims: []Claim{claim("shop-42", shop, 42, 50)},
			grant: Grant{Holder: "shop-42", HolderUID: "uid-shop-42", Token: 1, AcquiredAt: at(55),
				Lines: []LineRecord{{Repo: "acme/shop", Branch: "main", Build: 42, HeldAt: at(20), Token: 1202}}},
			want:   map[string]string{"shop-42": "Held Acquired"},
			holder: "shop-42", token: 1,
		},
		"a record edited to name the waiter names the holder again": {
			claims: []Claim{holder, waiter}, grant: Grant{Holder: "shop-42", HolderUID: "uid-shop-42", Token: 7, AcquiredAt: at(30)},
			want:   map[string]string{"web-5": "Held Acquired", "shop-42": "Waiting WaitingForHolder"},
			holder: "web-5", waiting: "shop-42", grantChanged: true, token: 7,
		},
		"a record edited to name a claim that does not exist names the holder again": {
			claims: []Claim{holder, waiter}, grant: Grant{Holder: "ghost", HolderUID: "uid-ghost", Token: 7, AcquiredAt: at(30)},
			want:   map[string]string{"web-5": "Held Acquired", "shop-42": "Waiting WaitingForHolder"},
			holder: "web-5", waiting: "shop-42", grantChanged: true, token: 7,
		},
		"a record edited to name nobody names the holder again": {
			claims: []Claim{holder, waiter}, grant: Grant{Token: 7},
			want:   map[string]string{"web-5": "Held Acquired", "shop-42": "Waiting WaitingForHolder"},
			holder: "web-5", waiting: "shop-42", grantChanged: true, token: 7,
		},
		"a record that freed the hold, recording its end, stands": {
			claims: []Claim{holder, waiter},
			grant:  Grant{Token: 7, Ended: Ending{Name: "web-5", UID: "uid-web-5", Phase: Released, Reason: ReasonPodFinished, At: at(50)}},
			want:   map[string]string{"web-5": "Released PodFinished", "shop-42": "Held Acquired"},
			holder: "shop-42", grantChanged: true, token: 8,
		},
		"a record naming a later grant stands, and the holder shown is lost": {
			claims: []Claim{holder, waiter}, grant: Grant{Holder: "shop-42", HolderUID: "uid-shop-42", Token: 8, AcquiredAt: at(55), Writer: waiter.Writer,
				Lines: []LineRecord{{Repo: "acme/web", Branch: "main", Build: 5, HeldAt: at(30)}}},
			want:   map[string]string{"web-5": "Released LockLost", "shop-42": "Held Acquired"},
			holder: "shop-42", token: 8,
		},
		"a record whose token was lowered gets the holder's token back": {
			claims: []Claim{holder}, grant: Grant{Holder: "web-5", HolderUID: "uid-web-5", Token: 1, AcquiredAt: at(30), Writer: holder.Writer},
			want:   map[string]string{"web-5": "Held Acquired"},
			holder: "web-5", grantChanged: true, token: 7,
		},
		"a record whose token was raised gets the holder's token back": {
			claims: []Claim{holder}, grant: Grant{Holder: "web-5", HolderUID: "uid-web-5", Token: 99, AcquiredAt: at(30), Writer: holder.Writer},
			want:   map[string]string{"web-5": "Held Acquired"},
			holder: "web-5", grantChanged: true, token: 7,
		},
		"a later grant to the holder, its status not written yet, keeps its token": {
			claims: []Claim{holder}, grant: Grant{Holder: "web-5", HolderUID: "uid-web-5", Token: 8, AcquiredAt: at(50), Writer: holder.Writer},
			want:   map[string]string{"web-5": "Held Acquired"},
			holder: "web-5", token: 8,
		},
		"a new holder's record whose token was lowered before its status was written is raised": {
			claims: []Claim{inPhase(heldSince(web5, 7, 30), Released), waiter},
			grant:  Grant{Holder: "shop-42", HolderUID: "uid-shop-42", Token: 2, AcquiredAt: at(55), Floor: 8, Writer: waiter.Writer},
			want:   map[string]string{"web-5": "Released (unchanged)", "shop-42": "Held Acquired"},
			holder: "shop-42", grantChanged: true, token: 8,
		},
	})
}

func withWriter(c Claim, pod string) Claim { c.Writer = Writer{PodUID: pod}; return c }

func TestARestoredRecordIsTheHoldsOwn(t *testing.T) {
	holder := as(heldSince(withWriter(web5, "pod-web-5"), 7, 30), webPipeline)
	gone := inPhase(as(heldSince(claim("web-4", web, 4, 1), 6, 10), webPipeline), Released)
	for name, tc := range map[string]struct {
		grant  Grant
		repair string
	}{
		"deleted":          {Grant{Absent: true}, RepairRecreated},
		"writer edited":    {Grant{Holder: "web-5", HolderUID: "uid-web-5", Token: 7, AcquiredAt: at(30), Writer: Writer{PodUID: "pod-of-an-intruder"}}, RepairWriter},
		"writer removed":   {Grant{Holder: "web-5", HolderUID: "uid-web-5", Token: 7, AcquiredAt: at(30)}, RepairWriter},
		"acquire time set": {Grant{Holder: "web-5", HolderUID: "uid-web-5", Token: 7, AcquiredAt: at(59), Writer: holder.Writer}, RepairToken},
		"holder edited":    {Grant{Holder: "shop-42", HolderUID: "uid-shop-42", Token: 7, AcquiredAt: at(30)}, RepairHolder},
	} {
		t.Run(name, func(t *testing.T) {
			d := Decide(staging, []Claim{holder, gone, shop42}, tc.grant, at(60), Policy{})
			want := Grant{Holder: "web-5", HolderUID: "uid-web-5", Token: 7, AcquiredAt: at(30), Writer: holder.Writer,
				Lines: []LineRecord{{Repo: "acme/web", Branch: "main", Build: 5, HeldAt: at(30), Owner: webPipeline, Token: 7, Started: at(20)}}}
			if !d.GrantChanged || d.Repair != tc.repair || !d.Grant.Equal(want) {
				t.Errorf("changed=%v repair=%q grant {%s}, want changed, repair %q, grant {%s}", d.GrantChanged, d.Repair, d.Grant, tc.repair, want)
			}
			again := Decide(staging, d.Apply([]Claim{holder, gone, shop42}), d.Grant, at(60), Policy{})
			if again.GrantChanged || again.Repair != "" {
				t.Errorf("the restored record is restored again: %s", again)
			}
		})
	}
}

func TestAnEditedLineMemoryIsRestoredFromTheClaims(t *testing.T) {
	// The record's line memory was removed by hand (or no longer parsed);
	// a claim that held is still there.
	before := inPhase(heldSince(claim("shop-10", shop, 10, 5), 3, 10), Released)
	shopLine := LineRecord{Repo: "acme/shop", Branch: "main", Build: 10, HeldAt: at(10), Token: 3, Started: at(5)}
	for name, tc := range map[string]struct {
		claims []Claim
		grant  Grant
		want   []LineRecord
	}{
		"a free record": {claims: []Claim{before}, grant: Grant{Token: 4}, want: []LineRecord{shopLine}},
		"a holder's record": {
			claims: []Claim{before, heldSince(web5, 4, 30)},
			grant:  Grant{Holder: "web-5", HolderUID: "uid-web-5", Token: 4, AcquiredAt: at(30)},
			want:   []LineRecord{shopLine, {Repo: "acme/web", Branch: "main", Build: 5, HeldAt: at(30), Token: 4, Started: at(20)}},
		},
	} {
		t.Run(name, func(t *testing.T) {
			d := Decide(staging, tc.claims, tc.grant, at(60), Policy{})
			if !d.GrantChanged || d.Repair != RepairLines || !(Grant{Lines: tc.want}).Equal(Grant{Lines: d.Grant.Lines}) || d.Grant.Token != 4 {
				t.Errorf("the memory is not restored: %s", d)
			}
			if again := Decide(staging, d.Apply(tc.claims), d.Grant, at(60), Policy{}); again.GrantChanged {
				t.Errorf("restored again: %s", again)
			}
		})
	}
}

func TestADeletedRecordRemembersTheBuildsTheClaimsShowHeld(t *testing.T) {
	// The record is gone, and with it the memory that build 10 held; the
	// claim that held it is still there (its finished TTL has not passed).
	claims := []Claim{inPhase(heldSince(claim("shop-10", shop, 10, 5), 3, 10), Released), claim("shop-9", shop, 9, 50)}
	d := Decide(staging, claims, Grant{Absent: true}, at(60), Policy{})
	if v := verdictOf(d, "shop-9"); short(v) != "Superseded SupersededByNewerBuild" ||
		!strings.Contains(v.Message, "Build 10 of acme/shop@main already deployed: it held staging at 2026-03-02T09:10:00Z") {
		t.Errorf("shop-9: %s %q", short(v), v.Message)
	}
	want := []LineRecord{{Repo: "acme/shop", Branch: "main", Build: 10, HeldAt: at(10), Token: 3, Started: at(5)}}
	if !d.GrantChanged || d.Repair != RepairRecreated || d.Grant.Holder != "" || d.Grant.Token != 3 || !(Grant{Lines: want}).Equal(Grant{Lines: d.Grant.Lines}) {
		t.Errorf("the record is not written again with the memory: %s", d)
	}
	// Nothing to remember: no record is written.
	if d := Decide(staging, []Claim{inPhase(shop42, Superseded)}, Grant{Absent: true, Floor: 4}, at(60), Policy{}); d.GrantChanged {
		t.Errorf("a record written for nothing: %s", d)
	}
}

// TestADeletedClaimHasEnded: a claim kept by a finalizer after its delete
// (issue 21, item 6) ends, holder or waiter, and the lock goes on.
func TestADeletedClaimHasEnded(t *testing.T) {
	deleting := func(c Claim) Claim { c.Deleting = true; return c }
	runDecideCases(t, map[string]decideCase{
		"a holder being deleted is released, and the waiter holds": {
			claims: []Claim{deleting(held(web5, 7)), waiting(shop42)}, grant: webHolds,
			want:   map[string]string{"web-5": "Released Deleted", "shop-42": "Held Acquired"},
			holder: "shop-42", grantChanged: true, token: 8,
		},
		"a waiter being deleted leaves": {
			claims: []Claim{held(web5, 7), deleting(waiting(shop42))}, grant: webHolds,
			want:   map[string]string{"web-5": "Held Acquired", "shop-42": "Released Deleted"},
			holder: "web-5", token: 7,
		},
		"a claim deleted before it was decided never holds": {
			claims: []Claim{deleting(shop42)},
			want:   map[string]string{"shop-42": "Released Deleted"},
		},
	})
	d := Decide(staging, []Claim{deleting(held(web5, 7)), waiting(shop42)}, webHolds, at(60), Policy{})
	if got, want := verdictOf(d, "web-5").Message, "The BuildLock of build 5 of acme/web@main was deleted (a finalizer still keeps it); "+
		"its hold on staging ends: stop deploying."; got != want {
		t.Errorf("message %q\nwant %q", got, want)
	}
	if d.Grant.Ended.Reason != ReasonDeleted {
		t.Errorf("the record does not keep how the hold ended: %s", d.Grant)
	}
}

// TestLinesBelongToIdentities is rule 3's identities (issue 21, item 9).
func TestLinesBelongToIdentities(t *testing.T) {
	shopHeld := Grant{Token: 4, Lines: []LineRecord{{Repo: "acme/shop", Branch: "main", Build: 42, HeldAt: at(10), Owner: shopPipeline}}}
	huge := int64(9007199254740991)
	runDecideCases(t, map[string]decideCase{
		"another pipeline's higher build of the line is refused": {
			claims: []Claim{as(claim("evil", shop, huge, 50), webPipeline)}, grant: shopHeld,
			want:  map[string]string{"evil": "Superseded LineOwnedByOther"},
			token: 4,
		},
		"the owner's next build holds": {
			claims: []Claim{as(claim("shop-43", shop, 43, 50), shopPipeline)}, grant: shopHeld,
			want:   map[string]string{"shop-43": "Held Acquired"},
			holder: "shop-43", grantChanged: true, token: 5,
		},
		"the owner's build may not jump too far either": {
			claims: []Claim{as(claim("shop-big", shop, 42+DefaultMaxBuildJump+1, 50), shopPipeline)}, grant: shopHeld,
			want:  map[string]string{"shop-big": "Superseded BuildJumpTooLarge"},
			token: 4,
		},
		"a build without a verified identity may not jump too far": {
			claims: []Claim{claim("evil", shop, huge, 50)}, grant: shopHeld,
			want:  map[string]string{"evil": "Superseded BuildJumpTooLarge"},
			token: 4,
		},
		"a build without a verified identity within the jump holds": {
			claims: []Claim{claim("shop-1042", shop, 42+DefaultMaxBuildJump, 50)}, grant: shopHeld,
			want:   map[string]string{"shop-1042": "Held Acquired"},
			holder: "shop-1042", grantChanged: true, token: 5,
		},
		"the jump is the policy's": {
			claims: []Claim{claim("shop-45", shop, 45, 50)}, grant: shopHeld, policy: Policy{MaxBuildJump: 2},
			want:  map[string]string{"shop-45": "Superseded BuildJumpTooLarge"},
			token: 4,
		},
		"a person's claim is bound by neither": {
			claims: []Claim{as(claim("alice-1", shop, huge, 50), alice)}, grant: shopHeld,
			want:   map[string]string{"alice-1": "Held Acquired"},
			holder: "alice-1", grantChanged: true, token: 5,
		},
		"a line nobody remembers is anyone's": {
			claims: []Claim{as(claim("web-1", web, huge, 50), webPipeline)}, grant: shopHeld,
			want:   map[string]string{"web-1": "Held Acquired"},
			holder: "web-1", grantChanged: true, token: 5,
		},
		"the live holder's line is its own": {
			claims: []Claim{as(heldSince(claim("shop-42", shop, 42, 5), 4, 10), shopPipeline), as(claim("evil", shop, 43, 50), webPipeline)},
			grant:  Grant{Holder: "shop-42", HolderUID: "uid-shop-42", Token: 4, AcquiredAt: at(10)},
			want:   map[string]string{"shop-42": "Held Acquired", "evil": "Superseded LineOwnedByOther"},
			holder: "shop-42", token: 4,
		},
		"with Fifo a claim queued behind a new holder of another pipeline is refused": {
			claims: []Claim{as(claim("shop-43", shop, 43, 50), shopPipeline), as(claim("evil", shop, 44, 51), webPipeline)},
			policy: fifo,
			want:   map[string]string{"shop-43": "Held Acquired", "evil": "Superseded LineOwnedByOther"},
			holder: "shop-43", grantChanged: true, token: 1,
		},
	})
	// Who holds a line is remembered; a person's hold frees it.
	for identity, owner := range map[string]string{shopPipeline: shopPipeline, alice: alice, "": ""} {
		d := Decide(staging, []Claim{as(claim("shop-43", shop, 43, 50), identity)}, shopHeld, at(60), Policy{})
		if len(d.Grant.Lines) != 1 || d.Grant.Lines[0].Owner != owner {
			t.Errorf("a hold as %q records %v", identity, d.Grant.Lines)
		}
	}
	d := Decide(staging, []Claim{as(claim("evil", shop, huge, 50), webPipeline)}, shopHeld, at(60), Policy{})
	want := "Build 9007199254740991 of acme/shop@main will not deploy: its branch acme/shop@main belongs to " +
		"system:serviceaccount:ci:shop, which held staging with build 42 at 2026-03-02T09:10:00Z, and this claim was created by " +
		"system:serviceaccount:ci:web. The lines of a branch, whatever their workflows, belong to the pipeline that held one " +
		"of them last, until 2026-03-03T09:10:00Z; claim it as that pipeline, or have a person claim it."
	if got := verdictOf(d, "evil").Message; got != want {
		t.Errorf("message %q\nwant %q", got, want)
	}
	d = Decide(staging, []Claim{claim("evil", shop, huge, 50)}, shopHeld, at(60), Policy{})
	want = "Build 9007199254740991 of acme/shop@main is more than 1000 above build 42 of its line, which held staging at " +
		"2026-03-02T09:10:00Z: it will not deploy. Until 2026-03-03T09:10:00Z a build of the line may go at most 1000 higher " +
		"(the operator's --max-build-jump); give it a lower build number, or have a person claim it."
	if got := verdictOf(d, "evil").Message; got != want {
		t.Errorf("message %q\nwant %q", got, want)
	}
}

// TestCIIdentitiesArePipelines (issue 25): a CI identity (an OIDC token of
// GitHub Actions or GitLab CI, mapped to a user with a repository) owns the
// lines it holds and is bound by the jump, as a service account is; it is
// no person.
func TestCIIdentitiesArePipelines(t *testing.T) {
	const shopCI = "github:acme/shop"
	ci := func(c Claim) Claim { c.Identity, c.CIIdentity = shopCI, true; return c }
	byCI := Grant{Token: 4, Lines: []LineRecord{{Repo: "acme/shop", Branch: "main", Build: 42, HeldAt: at(10), Owner: shopCI, OwnerCI: true}}}
	bySA := Grant{Token: 4, Lines: []LineRecord{{Repo: "acme/shop", Branch: "main", Build: 42, HeldAt: at(10), Owner: shopPipeline}}}
	huge := int64(9007199254740991)
	runDecideCases(t, map[string]decideCase{
		"a service account's claim of a line a CI identity holds is refused": {
			claims: []Claim{as(claim("evil", shop, huge, 50), webPipeline)}, grant: byCI,
			want:  map[string]string{"evil": "Superseded LineOwnedByOther"},
			token: 4,
		},
		"a CI identity's claim of a line a service account holds is refused": {
			claims: []Claim{ci(claim("shop-43", shop, 43, 50))}, grant: bySA,
			want:  map[string]string{"shop-43": "Superseded LineOwnedByOther"},
			token: 4,
		},
		"the CI identity's next build holds": {
			claims: []Claim{ci(claim("shop-43", shop, 43, 50))}, grant: byCI,
			want:   map[string]string{"shop-43": "Held Acquired"},
			holder: "shop-43", grantChanged: true, token: 5,
		},
		"a CI identity's build may not jump too far": {
			claims: []Claim{ci(claim("shop-big", shop, 42+DefaultMaxBuildJump+1, 50))}, grant: byCI,
			want:  map[string]string{"shop-big": "Superseded BuildJumpTooLarge"},
			token: 4,
		},
	})
	d := Decide(staging, []Claim{ci(claim("shop-43", shop, 43, 50))}, byCI, at(60), Policy{})
	if want := (LineRecord{Repo: "acme/shop", Branch: "main", Build: 43, HeldAt: at(60), Owner: shopCI, OwnerCI: true, Token: 5, Started: at(50)}); len(d.Grant.Lines) != 1 || !d.Grant.Lines[0].equal(want) {
		t.Errorf("a CI identity's hold records %v, want %v", d.Grant.Lines, want)
	}
	d = Decide(staging, []Claim{as(claim("evil", shop, huge, 50), webPipeline)}, byCI, at(60), Policy{})
	if got := verdictOf(d, "evil").Message; !strings.Contains(got, "its branch acme/shop@main belongs to github:acme/shop, which held staging with build 42") {
		t.Errorf("message %q does not name the CI identity that owns the line", got)
	}
}

// TestARenewalStampedInThePastSaysSo (issue 21, item 15): a renewal counts
// from its time at the latest, so one stamped long enough ago ends the hold
// the moment it is seen, and the message says why.
func TestARenewalStampedInThePastSaysSo(t *testing.T) {
	holder := renewing(podless(held(web5, 7), 10*time.Minute), 35) // seen at 60, stamped 25 minutes earlier
	d := Decide(staging, []Claim{holder}, webHolds, at(60), Policy{})
	v := verdictOf(d, "web-5")
	want := "Build 5 of acme/web@main was renewed with spec.renewTime 2026-03-02T09:35:00Z, which is more than its " +
		"expiresAfter of 10m0s before the operator saw the renewal (at 2026-03-02T10:00:00Z): a renewal counts from its " +
		"time at the latest, so its hold on staging expired at 2026-03-02T09:45:00Z; stop deploying. Renew with the " +
		"current time (is the client's clock behind?)."
	if short(v) != "Expired Expired" || v.Message != want {
		t.Errorf("got %s %q\nwant %q", short(v), v.Message, want)
	}
	for name, tc := range map[string]struct {
		claim Claim
		want  string
	}{
		"never renewed": {
			claim: podless(held(web5, 7), 10*time.Minute),
			want:  "Build 5 of acme/web@main was not renewed in time: its hold on staging expired at 2026-03-02T09:40:00Z; stop deploying.",
		},
		"renewed, then not again": {
			claim: renewedAt(podless(held(web5, 7), 10*time.Minute), 35),
			want: "Build 5 of acme/web@main was not renewed in time: its last renewal, stamped 2026-03-02T09:35:00Z, kept its " +
				"hold on staging until 2026-03-02T09:45:00Z; stop deploying.",
		},
		"renewed with times before the hold began": {
			claim: renewedAt(podless(held(web5, 7), 10*time.Minute), 25),
			want: "Build 5 of acme/web@main was last renewed with spec.renewTime 2026-03-02T09:25:00Z, before its hold on " +
				"staging began (at 2026-03-02T09:30:00Z): a renewal counts from its time at the latest, so none extended " +
				"the hold, which expired at 2026-03-02T09:40:00Z; stop deploying. Renew with the current time (is the " +
				"client's clock behind?).",
		},
	} {
		t.Run(name, func(t *testing.T) {
			if v := verdictOf(Decide(staging, []Claim{tc.claim}, webHolds, at(60), Policy{}), "web-5"); v.Message != tc.want {
				t.Errorf("message %q\nwant %q", v.Message, tc.want)
			}
		})
	}
}

// TestTheTimestampSkewIsThePolicys (issue 21, item 17).
func TestTheTimestampSkewIsThePolicys(t *testing.T) {
	ahead := claim("ahead", "evil/repo@main", 1, 30)
	ahead.Timestamp = at(31) // a minute ahead of its creation
	for skew, want := range map[time.Duration]time.Time{
		0:                at(30).Add(DefaultMaxTimestampSkew),
		2 * time.Second:  at(30).Add(2 * time.Second),
		10 * time.Minute: at(31),
	} {
		if got := (Policy{MaxTimestampSkew: skew}).OrderTime(ahead); !got.Equal(want) {
			t.Errorf("skew %s: OrderTime %s, want %s", skew, got, want)
		}
	}
	// One created a second later, stamped honestly, ranks newer under the
	// default skew of a few seconds.
	later := claim("later", shop, 42, 30)
	later.Created, later.Timestamp = at(30).Add(DefaultMaxTimestampSkew+time.Second), at(30).Add(DefaultMaxTimestampSkew+time.Second)
	if !(Policy{}).Newer(later, ahead) || (Policy{MaxTimestampSkew: time.Hour}).Newer(later, ahead) {
		t.Errorf("the skew does not decide which claim is newer")
	}
}

// TestAStalePictureOfADeletedHolderIsNotRestored is the short chaos run's
// finding (seed 1, after issue 21's merge): a manager frees the lock of a
// holder whose claim was deleted; a second manager, whose claims cache still
// shows that claim Held, took the freed record for one edited to name
// nobody and restored the deleted hold with its token (rule 11). The freed
// record now records the vanished holder's end, so that a stale picture of
// it is recognized as over.
func TestAStalePictureOfADeletedHolderIsNotRestored(t *testing.T) {
	holder := heldSince(web5, 1, 30)
	grant := Grant{Holder: "web-5", HolderUID: "uid-web-5", Token: 1, AcquiredAt: at(30),
		Lines: []LineRecord{{Repo: "acme/web", Branch: "main", Build: 5, HeldAt: at(30)}}}

	freed := Decide(staging, nil, grant, at(40), Policy{})
	if !freed.GrantChanged || freed.Grant.Holder != "" {
		t.Fatalf("the lock of a deleted holder must be freed, got %s", freed)
	}
	if e := freed.Grant.Ended; e.Name != "web-5" || e.UID != "uid-web-5" || e.Phase != Released || e.Reason != ReasonDeleted {
		t.Fatalf("the freed record must record the deleted holder's end, got %+v", e)
	}

	stale := Decide(staging, []Claim{holder}, freed.Grant, at(41), Policy{})
	if stale.Repair != "" || stale.Grant.Holder != "" || stale.Grant.Token != 1 {
		t.Fatalf("a stale picture of the deleted holder must not restore its hold, got %s", stale)
	}
	if v := verdictOf(stale, "web-5"); v.Phase != Released || v.Reason != ReasonDeleted {
		t.Errorf("the stale picture of the holder ends as the record says, got %s %s", v.Phase, v.Reason)
	}

	// The same when a waiter takes over: the new record names the
	// deleted holder's end too.
	waiter := waiting(shop42)
	handedOn := Decide(staging, []Claim{waiter}, grant, at(40), Policy{})
	if e := handedOn.Grant.Ended; handedOn.Grant.Holder != "shop-42" || e.Name != "web-5" || e.Reason != ReasonDeleted {
		t.Fatalf("a hand-off from a deleted holder must record its end, got %s", handedOn)
	}
}
