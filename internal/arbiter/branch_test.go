package arbiter

import (
	"strings"
	"testing"
	"time"
)

// Issue 31: the lines of a branch, and a memory that has no room.

// verifiedWorkflow makes c the claim of acme/shop's CI identity whose
// token names c's workflow (Claim.WorkflowVerified).
func verifiedWorkflow(c Claim) Claim {
	c.Identity, c.CIIdentity, c.WorkflowVerified = "github:acme/shop", true, true
	return c
}

// deployRecord is the record of build 500 of acme/shop@main's deploy.yml,
// started at minute 5 and held at minute 20.
var deployRecord = LineRecord{Repo: "acme/shop", Branch: "main", Workflow: "deploy.yml", Build: 500, HeldAt: at(20), Token: 4,
	Started: at(5)}

func TestAVerifiedWorkflowNumbersItsOwnBuilds(t *testing.T) {
	fortyTwoHeld := Grant{Token: 4, Lines: []LineRecord{{Repo: "acme/shop", Branch: "main", Build: 42, HeldAt: at(10), Owner: "github:acme/shop",
		OwnerCI: true, Token: 4, Started: at(8)}}}
	runDecideCases(t, map[string]decideCase{
		"a workflow the CI token names counts its own builds": {
			claims: []Claim{verifiedWorkflow(ofWorkflow(claim("x-41", shop, 41, 50), "x"))}, grant: fortyTwoHeld, policy: strict,
			want:   map[string]string{"x-41": "Held Acquired"},
			holder: "x-41", grantChanged: true, token: 5,
		},
		"but not one that started before the branch's newest build": {
			claims: []Claim{created(verifiedWorkflow(ofWorkflow(claim("x-41", shop, 41, 7), "x")), 50)}, grant: fortyTwoHeld, policy: strict,
			want:  map[string]string{"x-41": "Superseded SupersededByNewerBuild"},
			token: 4,
		},
		"a CI identity's workflow its token does not name is judged by the branch's numbers": {
			claims: []Claim{as(ofWorkflow(claim("x-41", shop, 41, 50), "x"), "github:acme/shop")}, grant: fortyTwoHeld, policy: strict,
			want:  map[string]string{"x-41": "Superseded SupersededByNewerBuild"},
			token: 4,
		},
	})
}

func TestTheBranchRemembersWhenItsBuildsStarted(t *testing.T) {
	g := Grant{Token: 4, Lines: []LineRecord{deployRecord}}
	hotfixRolledBack := Grant{Token: 5, Lines: []LineRecord{deployRecord,
		{Repo: "acme/shop", Branch: "main", Workflow: "hotfix.yml", Build: 12, HeldAt: at(40), Token: 5, Since: at(40), Started: at(3)}}}
	runDecideCases(t, map[string]decideCase{
		"a build of its own line is judged by number, not by when it started": {
			claims: []Claim{created(ofWorkflow(claim("deploy-501", shop, 501, 4), "deploy.yml"), 50)}, grant: g,
			want:   map[string]string{"deploy-501": "Held Acquired"},
			holder: "deploy-501", grantChanged: true, token: 5,
		},
		"a build that started at the same instant deploys": {
			claims: []Claim{created(ofWorkflow(claim("hotfix-13", shop, 13, 5), "hotfix.yml"), 50)}, grant: g,
			want:   map[string]string{"hotfix-13": "Held Acquired"},
			holder: "hotfix-13", grantChanged: true, token: 5,
		},
		"another branch is not judged": {
			claims: []Claim{created(ofWorkflow(claim("dev-1", shopDev, 1, 1), "hotfix.yml"), 50)}, grant: g,
			want:   map[string]string{"dev-1": "Held Acquired"},
			holder: "dev-1", grantChanged: true, token: 5,
		},
		"a record of an older operator, which has no start, judges nothing by it": {
			claims: []Claim{created(ofWorkflow(claim("hotfix-13", shop, 13, 1), "hotfix.yml"), 50)},
			grant:  Grant{Token: 4, Lines: []LineRecord{{Repo: "acme/shop", Branch: "main", Workflow: "deploy.yml", Build: 500, HeldAt: at(20)}}},
			want:   map[string]string{"hotfix-13": "Held Acquired"},
			holder: "hotfix-13", grantChanged: true, token: 5,
		},
		"after a rollback of the branch, what it deployed before no longer counts": {
			claims: []Claim{created(ofWorkflow(claim("hotfix-13", shop, 13, 4), "hotfix.yml"), 50)}, grant: hotfixRolledBack,
			want:   map[string]string{"hotfix-13": "Held Acquired"},
			holder: "hotfix-13", grantChanged: true, token: 6,
		},
		"but the rollback's own build does": {
			claims: []Claim{created(ofWorkflow(claim("deploy-501", shop, 501, 2), "deploy.yml"), 50)}, grant: hotfixRolledBack,
			want:  map[string]string{"deploy-501": "Superseded SupersededByNewerBuild"},
			token: 5,
		},
	})
	// The grant records when the build started.
	d := Decide(staging, []Claim{created(ofWorkflow(claim("hotfix-13", shop, 13, 6), "hotfix.yml"), 50)}, g, at(60), Policy{})
	if r := d.Grant.Lines; len(r) != 2 || r[1].Workflow != "hotfix.yml" || !r[1].Started.Equal(at(6)) {
		t.Errorf("the grant records %+v", r)
	}
	// A claim stamped in the future starts no later than its creation plus
	// the skew allowance: it cannot push the branch's memory ahead.
	future := ofWorkflow(claim("hotfix-13", shop, 13, 50), "hotfix.yml")
	future.Timestamp = at(50).Add(1000 * time.Hour)
	d = Decide(staging, []Claim{future}, g, at(60), Policy{})
	if r := d.Grant.Lines; len(r) != 2 || !r[1].Started.Equal(at(50).Add(DefaultMaxTimestampSkew)) {
		t.Errorf("a claim stamped in the future is recorded as started at %s", r[1].Started)
	}
}

func TestBranchMessagesSayWhatAndWhatToDo(t *testing.T) {
	fortyTwoHeld := Grant{Token: 4, Lines: []LineRecord{shopRecord(42, 10, shopPipeline)}}
	deployHeld := Grant{Token: 4, Lines: []LineRecord{deployRecord}}
	for name, tc := range map[string]struct {
		claims []Claim
		grant  Grant
		policy Policy
		claim  string
		want   string
	}{
		"a build of another workflow that started earlier": {
			claims: []Claim{created(ofWorkflow(claim("hotfix-12", shop, 12, 3), "hotfix.yml"), 50)}, grant: deployHeld, claim: "hotfix-12",
			want: "Build 500 of acme/shop@main (workflow deploy.yml) already deployed: it started at 2026-03-02T09:05:00Z and held " +
				"staging at 2026-03-02T09:20:00Z, and this build started earlier, at 2026-03-02T09:03:00Z: a branch never deploys an " +
				"older build after a newer one, whatever their workflows, so this build will not deploy. Stop this pipeline; to deploy " +
				`it on purpose, roll back: kubectl buildlock acquire --rollback --reason "..." (spec.rollback).`,
		},
		"a lower build of a workflow nothing verified": {
			claims: []Claim{ofWorkflow(claim("shop-41-x", shop, 41, 50), "x")}, grant: fortyTwoHeld, claim: "shop-41-x",
			want: "Build 42 of acme/shop@main, and this claim's workflow x is not verified (no CI token of its requester names it), " +
				"so it counts as a build of acme/shop@main too, already deployed: it held staging at 2026-03-02T09:10:00Z, and a line " +
				"never deploys backwards, so this older build 41 will not deploy. Stop this pipeline; to deploy build 41 again on " +
				`purpose, roll back: kubectl buildlock acquire --rollback --reason "..." (spec.rollback).`,
		},
		"a build of another workflow that started before the new holder": {
			claims: []Claim{queuedAt(created(ofWorkflow(claim("hotfix-13", shop, 13, 6), "hotfix.yml"), 40), 40),
				queuedAt(created(ofWorkflow(claim("deploy-501", shop, 501, 5), "deploy.yml"), 41), 41)},
			policy: queue, claim: "deploy-501",
			want: "Build 13 of acme/shop@main (workflow hotfix.yml) started later (at 2026-03-02T09:06:00Z) and holds staging: a branch " +
				"never deploys an older build after a newer one, whatever their workflows, so this build, started at " +
				"2026-03-02T09:05:00Z, will not deploy. Stop this pipeline; to deploy it on purpose once that build has deployed, roll " +
				`back: kubectl buildlock acquire --rollback --reason "..." (spec.rollback).`,
		},
		"another pipeline's claim of a workflow of the branch": {
			claims: []Claim{as(ofWorkflow(claim("web-43", shop, 43, 50), "deploy.yml"), webPipeline)}, grant: Grant{Token: 4,
				Lines: []LineRecord{{Repo: "acme/shop", Branch: "main", Workflow: "hotfix.yml", Build: 7, HeldAt: at(10), Owner: shopPipeline}}},
			claim: "web-43",
			want: "Build 43 of acme/shop@main (workflow deploy.yml) will not deploy: its branch acme/shop@main belongs to " +
				"system:serviceaccount:ci:shop, which held staging with build 7 of workflow hotfix.yml at 2026-03-02T09:10:00Z, and " +
				"this claim was created by system:serviceaccount:ci:web. The lines of a branch, whatever their workflows, belong to " +
				"the pipeline that held one of them last, until 2026-03-03T09:10:00Z; claim it as that pipeline, or have a person " +
				"claim it.",
		},
	} {
		t.Run(name, func(t *testing.T) {
			v := verdictOf(Decide(staging, tc.claims, tc.grant, at(60), tc.policy), tc.claim)
			if v.Message != tc.want {
				t.Errorf("%s: message\n%q\nwant\n%q", short(v), v.Message, tc.want)
			}
		})
	}
}

func TestABranchBelongsToThePipelineThatHeldItLast(t *testing.T) {
	both := Grant{Token: 5, Lines: []LineRecord{
		{Repo: "acme/shop", Branch: "main", Workflow: "deploy.yml", Build: 500, HeldAt: at(10), Owner: shopPipeline, Token: 4},
		{Repo: "acme/shop", Branch: "main", Workflow: "hotfix.yml", Build: 12, HeldAt: at(20), Owner: alice, Token: 5},
	}}
	runDecideCases(t, map[string]decideCase{
		"a person's later hold of one line frees the branch": {
			claims: []Claim{as(ofWorkflow(claim("web-501", shop, 501, 50), "deploy.yml"), webPipeline)}, grant: both,
			want:   map[string]string{"web-501": "Held Acquired"},
			holder: "web-501", grantChanged: true, token: 6,
		},
		"a person's claim takes a branch another pipeline holds": {
			claims: []Claim{as(ofWorkflow(claim("alice-501", shop, 501, 50), "deploy.yml"), alice)},
			grant:  Grant{Token: 4, Lines: []LineRecord{both.Lines[0]}},
			want:   map[string]string{"alice-501": "Held Acquired"},
			holder: "alice-501", grantChanged: true, token: 5,
		},
	})
	// The person's claim on another pipeline's branch is audited.
	d := Decide(staging, []Claim{as(ofWorkflow(claim("alice-13", shop, 13, 50), "hotfix.yml"), alice)},
		Grant{Token: 4, Lines: []LineRecord{both.Lines[0]}}, at(60), Policy{})
	if a := d.Grant.Audit; len(a) != 1 || a[0].Kind != AuditOverride || a[0].Reason != ReasonLineOwnedByOther || a[0].Owner != shopPipeline || a[0].From != 500 {
		t.Errorf("audit %+v", a)
	}
}

func TestALineTheMemoryHasNoRoomForWaits(t *testing.T) {
	const intruder = "system:serviceaccount:ci:intruder"
	full := Grant{Token: 1, Lines: fullMemory(at(30), intruder, 0)}
	own := func(c Claim) Claim { return as(c, intruder) }
	runDecideCases(t, map[string]decideCase{
		"the flooder's next new line waits": {
			claims: []Claim{own(claim("new-1", "fake/new@main", 1, 50))}, grant: full,
			want:    map[string]string{"new-1": "Waiting LineMemoryFull"},
			waiting: "new-1", token: 1,
		},
		"the flooder's next build of a line it has goes": {
			claims: []Claim{own(claim("old-2", "fake/app-0003@"+strings.Repeat("b", 200), 2, 50))}, grant: full,
			want:   map[string]string{"old-2": "Held Acquired"},
			holder: "old-2", grantChanged: true, token: 2,
		},
		"another identity's new line goes": {
			claims: []Claim{as(claim("shop-1", shop, 1, 50), shopPipeline)}, grant: full,
			want:   map[string]string{"shop-1": "Held Acquired"},
			holder: "shop-1", grantChanged: true, token: 2,
		},
		"NewestWins: a new line that waits for room keeps the slot, and an older claim of a line with room goes": {
			claims: []Claim{own(claim("new-1", "fake/new@main", 1, 50)), as(claim("shop-1", shop, 1, 40), shopPipeline)}, grant: full,
			want:   map[string]string{"new-1": "Waiting LineMemoryFull", "shop-1": "Held Acquired"},
			holder: "shop-1", waiting: "new-1", grantChanged: true, token: 2,
		},
		"Queue: the claim behind it goes first": {
			claims: []Claim{queuedAt(own(claim("new-1", "fake/new@main", 1, 40)), 40), queuedAt(as(claim("shop-1", shop, 1, 41), shopPipeline), 41)},
			grant:  full, policy: queue,
			want:   map[string]string{"new-1": "Waiting LineMemoryFull", "shop-1": "Held Acquired"},
			holder: "shop-1", waiting: "new-1", grantChanged: true, token: 2,
		},
	})
	d := Decide(staging, []Claim{own(claim("new-1", "fake/new@main", 1, 50))}, full, at(60), Policy{})
	// The oldest record leaves the memory LineMemory after it held.
	if want := full.Lines[len(full.Lines)-1].HeldAt.Add(DefaultGrantRetention); !d.NextLook.Equal(want) {
		t.Errorf("NextLook %s, want %s, when the first record leaves the memory", d.NextLook, want)
	}
	if v := verdictOf(d, "new-1"); !strings.HasPrefix(v.Message, "Build 1 of fake/new@main waits: the lines held as "+
		"system:serviceaccount:ci:intruder fill its share of the memory of lines of staging (24 KiB), so its line, new to the lock, "+
		"cannot be remembered") {
		t.Errorf("message %q", v.Message)
	}
	// Once the records leave, it goes.
	if d := Decide(staging, d.Apply([]Claim{own(claim("new-1", "fake/new@main", 1, 50))}), full, d.NextLook.Add(time.Minute), Policy{}); d.Holder != "new-1" {
		t.Errorf("new-1 does not hold once the memory has room:\n%s", d)
	}
}
