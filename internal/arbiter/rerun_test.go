package arbiter

import (
	"strings"
	"testing"
)

// Issue 22: re-runs, rollbacks and second workflows.

// rollback makes c a rollback on purpose, for reason.
func rollback(c Claim, reason string) Claim {
	c.Rollback, c.RollbackReason = true, reason
	return c
}

// ofWorkflow puts c in workflow w of its repository and branch.
func ofWorkflow(c Claim, w string) Claim { c.Workflow = w; return c }

// shopRecord is the line memory of build n of acme/shop@main granted at
// minute, as identity.
func shopRecord(n int64, minute int, identity string) LineRecord {
	return LineRecord{Repo: "acme/shop", Branch: "main", Build: n, HeldAt: at(minute), Owner: identity}
}

// TestReruns is item 1: a run of the build that held last for its line is
// granted like any build once the earlier run's claim has ended, unless a
// higher build of the line held since; two runs of one build at once stay
// refused; a policy may refuse re-runs.
func TestReruns(t *testing.T) {
	fiveHundredHeld := Grant{Token: 4, Lines: []LineRecord{shopRecord(500, 10, "")}}
	firstRun := claim("shop-500", shop, 500, 5)
	rerun := claim("shop-500-rerun", shop, 500, 50)
	for _, policy := range []Policy{{}, queue, fifo} {
		name := string(policy.Ordering) + ": "
		runDecideCases(t, map[string]decideCase{
			name + "a re-run after the first run's claim ended (its claim gone) holds": {
				claims: []Claim{rerun}, grant: fiveHundredHeld, policy: policy,
				want:   map[string]string{"shop-500-rerun": "Held Acquired"},
				holder: "shop-500-rerun", grantChanged: true, token: 5,
			},
			name + "a re-run after the first run's claim ended (its claim still shown Released) holds": {
				claims: []Claim{inPhase(heldSince(firstRun, 4, 10), Released), rerun}, grant: fiveHundredHeld, policy: policy,
				want:   map[string]string{"shop-500": "Released (unchanged)", "shop-500-rerun": "Held Acquired"},
				holder: "shop-500-rerun", grantChanged: true, token: 5,
			},
			name + "a re-run whose first run ends in this very decision holds": {
				claims: []Claim{withPod(heldSince(firstRun, 4, 10), PodFinished), rerun},
				grant:  Grant{Holder: "shop-500", HolderUID: "uid-shop-500", Token: 4, AcquiredAt: at(10)}, policy: policy,
				want:   map[string]string{"shop-500": "Released PodFinished", "shop-500-rerun": "Held Acquired"},
				holder: "shop-500-rerun", grantChanged: true, token: 5,
			},
			name + "a re-run while the first run holds is refused: two runs of one build never go at once": {
				claims: []Claim{heldSince(firstRun, 4, 10), rerun},
				grant:  Grant{Holder: "shop-500", HolderUID: "uid-shop-500", Token: 4, AcquiredAt: at(10)}, policy: policy,
				want:   map[string]string{"shop-500": "Held Acquired", "shop-500-rerun": "Superseded DuplicateBuild by=shop-500"},
				holder: "shop-500", token: 4,
			},
			name + "a re-run after a higher build of the line held since is superseded": {
				claims: []Claim{rerun}, grant: Grant{Token: 5, Lines: []LineRecord{shopRecord(501, 20, "")}}, policy: policy,
				want:  map[string]string{"shop-500-rerun": "Superseded SupersededByNewerBuild"},
				token: 5,
			},
			name + "a re-run is refused where the policy refuses re-runs": {
				claims: []Claim{rerun}, grant: fiveHundredHeld, policy: refusingReruns(policy),
				want:  map[string]string{"shop-500-rerun": "Superseded DuplicateBuild"},
				token: 4,
			},
		})
	}
	queueing := map[string]decideCase{}
	for _, policy := range []Policy{{}, queue, fifo} {
		queueing[string(policy.Ordering)+": a re-run while the first run waits is refused"] = decideCase{
			claims: []Claim{held(web5, 7), queuedAt(firstRun, 40), rerun}, grant: webHolds, policy: policy,
			want: map[string]string{
				"web-5": "Held Acquired", "shop-500": "Waiting " + waitReason(policy),
				"shop-500-rerun": "Superseded DuplicateBuild by=shop-500",
			},
			holder: "web-5", waiting: "shop-500", token: 7,
		}
	}
	runDecideCases(t, queueing)

	// The grant remembers the re-run: its later grant, as its identity.
	d := Decide(staging, []Claim{as(rerun, shopPipeline)}, fiveHundredHeld, at(60), Policy{})
	if r := d.Grant.Lines; len(r) != 1 || r[0].Build != 500 || !r[0].HeldAt.Equal(at(60)) || r[0].Owner != shopPipeline {
		t.Errorf("the re-run's grant is remembered as %+v", r)
	}
}

// waitReason is the reason a claim waits with under p.
func waitReason(p Policy) string {
	if queuing(p) {
		return ReasonQueued
	}
	return ReasonWaitingForHolder
}

// TestRollbacks is item 2: a rollback is exempt from "never backwards" and
// from nothing else, its grant lowers the line's memory to its build so that
// the line's next build deploys normally, the policy says whose rollbacks
// are allowed, and every rollback is recorded.
func TestRollbacks(t *testing.T) {
	fortyTwoHeld := Grant{Token: 4, Lines: []LineRecord{shopRecord(42, 10, shopPipeline)}}
	back := rollback(shop41, "INC-7: 42 breaks checkout")
	rolledBack := Grant{Token: 5, Lines: []LineRecord{{Repo: "acme/shop", Branch: "main", Build: 41, HeldAt: at(20), Since: at(20)}}}
	runDecideCases(t, map[string]decideCase{
		"a rollback below the line's memory holds": {
			claims: []Claim{back}, grant: fortyTwoHeld,
			want:   map[string]string{"shop-41": "Held Acquired"},
			holder: "shop-41", grantChanged: true, token: 5,
		},
		"the same build without --rollback is superseded": {
			claims: []Claim{shop41}, grant: fortyTwoHeld,
			want:  map[string]string{"shop-41": "Superseded SupersededByNewerBuild"},
			token: 4,
		},
		"after a rollback the line's next build deploys normally": {
			claims: []Claim{shop42}, grant: rolledBack,
			want:   map[string]string{"shop-42": "Held Acquired"},
			holder: "shop-42", grantChanged: true, token: 6,
		},
		"after a rollback a build below it is still superseded": {
			claims: []Claim{claim("shop-40", shop, 40, 50)}, grant: rolledBack,
			want:  map[string]string{"shop-40": "Superseded SupersededByNewerBuild"},
			token: 5,
		},
		"a claim that held before the rollback no longer counts for its line": {
			claims: []Claim{inPhase(heldSince(claim("shop-42-first", shop, 42, 5), 4, 10), Released), shop42}, grant: rolledBack,
			want:   map[string]string{"shop-42-first": "Released (unchanged)", "shop-42": "Held Acquired"},
			holder: "shop-42", grantChanged: true, token: 6,
		},
		"with its record deleted, the claims still show the rollback": {
			claims: []Claim{
				inPhase(heldSince(claim("shop-42-first", shop, 42, 5), 4, 10), Released),
				inPhase(heldSince(back, 5, 20), Released), shop42,
			},
			grant:  Grant{Absent: true},
			want:   map[string]string{"shop-42-first": "Released (unchanged)", "shop-41": "Released (unchanged)", "shop-42": "Held Acquired"},
			holder: "shop-42", grantChanged: true, token: 6,
		},
		"of two rollbacks of a line granted at one instant, the later grant is the line's": {
			// shop-45 rolled back, held and ended at minute 60; shop-40 rolls
			// back then too: the higher token tells which grant came last.
			claims: []Claim{inPhase(heldSince(rollback(claim("shop-45", shop, 45, 5), "first"), 5, 60), Released), rollback(claim("shop-40", shop, 40, 55), "second")},
			grant: Grant{Token: 5, Lines: []LineRecord{{Repo: "acme/shop", Branch: "main", Build: 45, HeldAt: at(60), Since: at(60), Token: 5}},
				Ended: Ending{Name: "shop-45", UID: "uid-shop-45", Phase: Released, Reason: ReasonPodFinished, At: at(60)}},
			want:   map[string]string{"shop-45": "Released (unchanged)", "shop-40": "Held Acquired"},
			holder: "shop-40", grantChanged: true, token: 6,
		},
		"a rollback granted at the instant of another, recorded by an older operator, holds too": {
			claims: []Claim{inPhase(heldSince(rollback(claim("shop-45", shop, 45, 5), "first"), 5, 60), Released), rollback(claim("shop-40", shop, 40, 55), "second")},
			grant: Grant{Token: 5, Lines: []LineRecord{{Repo: "acme/shop", Branch: "main", Build: 45, HeldAt: at(60), Since: at(60)}},
				Ended: Ending{Name: "shop-45", UID: "uid-shop-45", Phase: Released, Reason: ReasonPodFinished, At: at(60)}},
			want:   map[string]string{"shop-45": "Released (unchanged)", "shop-40": "Held Acquired"},
			holder: "shop-40", grantChanged: true, token: 6,
		},
		"a rollback waits for the holder: no pre-emption": {
			claims: []Claim{held(web5, 7), back}, grant: withLines(webHolds, fortyTwoHeld.Lines),
			want:   map[string]string{"web-5": "Held Acquired", "shop-41": "Waiting WaitingForHolder"},
			holder: "web-5", waiting: "shop-41", token: 7,
		},
		"a rollback waits for the holder of its own line": {
			claims: []Claim{heldSince(shop42, 4, 10), back}, grant: grantTo(shop42, 4, 10),
			want:   map[string]string{"shop-42": "Held Acquired", "shop-41": "Waiting WaitingForHolder"},
			holder: "shop-42", waiting: "shop-41", token: 4,
		},
		"a rollback to the holder's own build is another run of it, refused": {
			claims: []Claim{heldSince(shop42, 4, 10), rollback(claim("shop-42-again", shop, 42, 50), "again")}, grant: grantTo(shop42, 4, 10),
			want:   map[string]string{"shop-42": "Held Acquired", "shop-42-again": "Superseded DuplicateBuild by=shop-42"},
			holder: "shop-42", token: 4,
		},
		"a rollback gives way to a newer build of its line that waits": {
			claims: []Claim{held(web5, 7), back, shop43}, grant: webHolds,
			want: map[string]string{
				"web-5": "Held Acquired", "shop-43": "Waiting WaitingForHolder", "shop-41": "Superseded SupersededByNewerBuild by=shop-43",
			},
			holder: "web-5", waiting: "shop-43", token: 7,
		},
		"with Fifo a rollback queued behind a higher build of its line keeps its place": {
			claims: []Claim{held(web5, 7), queuedAt(shop43, 40), queuedAt(back, 45)}, grant: webHolds, policy: fifo,
			want:   map[string]string{"web-5": "Held Acquired", "shop-43": "Waiting Queued", "shop-41": "Waiting Queued"},
			holder: "web-5", waiting: "shop-43", token: 7,
		},
		"with Fifo a build queued behind a rollback is judged against the higher build ahead": {
			claims: []Claim{held(web5, 7), queuedAt(shop43, 40), queuedAt(back, 45), queuedAt(shop42, 46)}, grant: webHolds, policy: fifo,
			want: map[string]string{
				"web-5": "Held Acquired", "shop-43": "Waiting Queued", "shop-41": "Waiting Queued",
				"shop-42": "Superseded SupersededByNewerBuild by=shop-43",
			},
			holder: "web-5", waiting: "shop-43", token: 7,
		},
		"a rollback is still bound by its line's owner": {
			claims: []Claim{as(back, webPipeline)}, grant: fortyTwoHeld,
			want:  map[string]string{"shop-41": "Superseded LineOwnedByOther"},
			token: 4,
		},
		"rollbacks: Nobody refuses every rollback": {
			claims: []Claim{as(back, alice)}, grant: fortyTwoHeld, policy: Policy{Rollbacks: RollbacksNobody},
			want:  map[string]string{"shop-41": "Superseded RollbackNotAllowed"},
			token: 4,
		},
		"rollbacks: Nobody refuses a rollback that goes nowhere backwards too": {
			claims: []Claim{rollback(shop43, "no")}, grant: fortyTwoHeld, policy: Policy{Rollbacks: RollbacksNobody},
			want:  map[string]string{"shop-43": "Superseded RollbackNotAllowed"},
			token: 4,
		},
		"rollbacks: PeopleOnly refuses a pipeline's": {
			claims: []Claim{as(back, shopPipeline)}, grant: fortyTwoHeld, policy: Policy{Rollbacks: RollbacksPeopleOnly},
			want:  map[string]string{"shop-41": "Superseded RollbackNotAllowed"},
			token: 4,
		},
		"rollbacks: PeopleOnly refuses one whose requester is not verified: it fails closed": {
			claims: []Claim{back}, grant: fortyTwoHeld, policy: Policy{Rollbacks: RollbacksPeopleOnly},
			want:  map[string]string{"shop-41": "Superseded RollbackNotAllowed"},
			token: 4,
		},
		"rollbacks: PeopleOnly allows a person's": {
			claims: []Claim{as(back, alice)}, grant: fortyTwoHeld, policy: Policy{Rollbacks: RollbacksPeopleOnly},
			want:   map[string]string{"shop-41": "Held Acquired"},
			holder: "shop-41", grantChanged: true, token: 5,
		},
		"rollbacks: Anyone allows a pipeline's": {
			claims: []Claim{as(back, shopPipeline)}, grant: fortyTwoHeld, policy: Policy{Rollbacks: RollbacksAnyone},
			want:   map[string]string{"shop-41": "Held Acquired"},
			holder: "shop-41", grantChanged: true, token: 5,
		},
	})

	// Its grant lowers the line's memory, records when, and is audited.
	d := Decide(staging, []Claim{as(back, alice)}, fortyTwoHeld, at(60), Policy{})
	want := LineRecord{Repo: "acme/shop", Branch: "main", Build: 41, HeldAt: at(60), Owner: alice, Since: at(60), Token: 5, Started: at(12)}
	if len(d.Grant.Lines) != 1 || !d.Grant.Lines[0].equal(want) {
		t.Errorf("the rollback's grant records %+v, want %+v", d.Grant.Lines, want)
	}
	wantAudit := AuditEntry{Kind: AuditRollback, At: at(60), Name: "shop-41", Repo: "acme/shop", Branch: "main", Build: 41,
		Token: 5, By: alice, Reason: "INC-7: 42 breaks checkout", From: 42}
	if len(d.Grant.Audit) != 1 || !d.Grant.Audit[0].equal(wantAudit) {
		t.Errorf("the rollback is audited as %+v, want %+v", d.Grant.Audit, wantAudit)
	}
	if v := verdictOf(d, "shop-41"); v.Message != `Holding staging with fencing token 5, as a rollback of acme/shop@main to build 41 `+
		`("INC-7: 42 breaks checkout"); deploy now and delete this BuildLock when done.` {
		t.Errorf("the rollback's message: %q", v.Message)
	}
}

// withLines is g remembering lines.
func withLines(g Grant, lines []LineRecord) Grant { g.Lines = lines; return g }

// TestWorkflowLines is item 3: where a CI system numbers builds per
// workflow, the workflow is part of the line; claims without one are of
// the line of repo and branch, as before.
func TestWorkflowLines(t *testing.T) {
	deployHeld := Grant{Token: 4, Lines: []LineRecord{{Repo: "acme/shop", Branch: "main", Workflow: "deploy.yml", Build: 500, HeldAt: at(10)}}}
	oldHeld := Grant{Token: 4, Lines: []LineRecord{shopRecord(500, 10, "")}}
	hotfix12 := ofWorkflow(claim("hotfix-12", shop, 12, 50), "hotfix.yml")
	runDecideCases(t, map[string]decideCase{
		"a second workflow's lower run number holds": {
			claims: []Claim{hotfix12}, grant: deployHeld,
			want:   map[string]string{"hotfix-12": "Held Acquired"},
			holder: "hotfix-12", grantChanged: true, token: 5,
		},
		"a lower run of the same workflow is superseded": {
			claims: []Claim{ofWorkflow(claim("deploy-499", shop, 499, 50), "deploy.yml")}, grant: deployHeld,
			want:  map[string]string{"deploy-499": "Superseded SupersededByNewerBuild"},
			token: 4,
		},
		"a claim without a workflow is of the line of repo and branch, as before": {
			claims: []Claim{claim("shop-499", shop, 499, 50)}, grant: oldHeld,
			want:  map[string]string{"shop-499": "Superseded SupersededByNewerBuild"},
			token: 4,
		},
		"a workflow's claim that a CI token verified is not of the line without one": {
			claims: []Claim{verifiedWorkflow(hotfix12)}, grant: oldHeld,
			want:   map[string]string{"hotfix-12": "Held Acquired"},
			holder: "hotfix-12", grantChanged: true, token: 5,
		},
		"a workflow's claim nothing verified is judged as one of the line without one too (issue 31)": {
			claims: []Claim{hotfix12}, grant: oldHeld,
			want:  map[string]string{"hotfix-12": "Superseded SupersededByNewerBuild"},
			token: 4,
		},
		"two workflows' waiting builds are two lines (NewestWins: the newer takes the slot)": {
			claims: []Claim{held(web5, 7), ofWorkflow(waiting(claim("deploy-500", shop, 500, 40)), "deploy.yml"), hotfix12}, grant: webHolds,
			want: map[string]string{
				"web-5": "Held Acquired", "hotfix-12": "Waiting WaitingForHolder", "deploy-500": "Superseded SupersededByNewerBuild by=hotfix-12",
			},
			holder: "web-5", waiting: "hotfix-12", token: 7,
		},
		"with Queue two workflows of one branch queue as two lines": {
			claims: []Claim{held(web5, 7), ofWorkflow(queuedAt(claim("deploy-500", shop, 500, 40), 40), "deploy.yml"), hotfix12}, grant: webHolds, policy: queue,
			want:   map[string]string{"web-5": "Held Acquired", "deploy-500": "Waiting Queued", "hotfix-12": "Waiting Queued"},
			holder: "web-5", waiting: "deploy-500", token: 7,
		},
	})
	d := Decide(staging, []Claim{hotfix12}, deployHeld, at(60), Policy{})
	if len(d.Grant.Lines) != 2 || d.Grant.Lines[1].Workflow != "hotfix.yml" || d.Grant.Lines[0].Workflow != "deploy.yml" {
		t.Errorf("the workflows' lines are remembered as %+v", d.Grant.Lines)
	}
	if v := verdictOf(Decide(staging, []Claim{ofWorkflow(claim("deploy-499", shop, 499, 50), "deploy.yml")}, deployHeld, at(60), Policy{}), "deploy-499"); !strings.HasPrefix(v.Message,
		"Build 500 of acme/shop@main (workflow deploy.yml) already deployed") {
		t.Errorf("the message does not name the workflow: %q", v.Message)
	}
}

// TestTheAuditOutlivesTheClaims is item 6: a force-release, a rollback and
// an override are recorded in the grant record, bounded, and a decision
// that changes nothing records nothing.
func TestTheAuditOutlivesTheClaims(t *testing.T) {
	fortyTwo := Grant{Token: 4, Lines: []LineRecord{shopRecord(42, 10, shopPipeline)}}
	for name, tc := range map[string]struct {
		claims []Claim
		grant  Grant
		want   []AuditEntry
	}{
		"a force-released holder, and the waiter that takes over": {
			claims: []Claim{verifiedBy(forceReleased(held(web5, 7)), alice), waiting(shop42)},
			grant:  webHolds,
			want: []AuditEntry{{Kind: AuditForceRelease, At: at(60), Name: "web-5", Repo: "acme/web", Branch: "main", Build: 5, Token: 7,
				By: alice, Reason: "alice: stuck deploy"}},
		},
		"a force-released holder with nobody to take over": {
			claims: []Claim{forceReleased(held(web5, 7))},
			grant:  webHolds,
			want: []AuditEntry{{Kind: AuditForceRelease, At: at(60), Name: "web-5", Repo: "acme/web", Branch: "main", Build: 5, Token: 7,
				Reason: "alice: stuck deploy"}},
		},
		"a person's claim on a line another pipeline owns": {
			claims: []Claim{as(shop43, alice)}, grant: fortyTwo,
			want: []AuditEntry{{Kind: AuditOverride, At: at(60), Name: "shop-43", Repo: "acme/shop", Branch: "main", Build: 43, Token: 5,
				By: alice, Reason: ReasonLineOwnedByOther, From: 42, Owner: shopPipeline}},
		},
		"a person's claim that jumps further than a pipeline's may": {
			claims: []Claim{as(claim("shop-big", shop, 42+DefaultMaxBuildJump+1, 50), alice)},
			grant:  Grant{Token: 4, Lines: []LineRecord{shopRecord(42, 10, "")}},
			want: []AuditEntry{{Kind: AuditOverride, At: at(60), Name: "shop-big", Repo: "acme/shop", Branch: "main", Build: 42 + DefaultMaxBuildJump + 1,
				Token: 5, By: alice, Reason: ReasonBuildJumpTooLarge, From: 42}},
		},
		"an ordinary hand-off": {
			claims: []Claim{withPod(held(web5, 7), PodFinished), waiting(shop42)}, grant: webHolds,
		},
	} {
		t.Run(name, func(t *testing.T) {
			d := Decide(staging, tc.claims, tc.grant, at(60), Policy{})
			if len(d.Grant.Audit) != len(tc.want) {
				t.Fatalf("audit %+v, want %+v", d.Grant.Audit, tc.want)
			}
			for k := range tc.want {
				if !d.Grant.Audit[k].equal(tc.want[k]) {
					t.Errorf("audit entry %+v, want %+v", d.Grant.Audit[k], tc.want[k])
				}
			}
			if again := Decide(staging, d.Apply(tc.claims), d.Grant, at(60), Policy{}); again.GrantChanged {
				t.Errorf("deciding again records more: %s", again)
			}
		})
	}

	// Bounded: the newest MaxAuditEntries, free text cut.
	g := webHolds
	for k := range MaxAuditEntries + 3 {
		g.Audit = append(g.Audit, AuditEntry{Kind: AuditRollback, At: at(k), Name: "old", Reason: "r"})
	}
	long := strings.Repeat("é", 2*MaxQuotedLength)
	c := verifiedBy(held(web5, 7), alice)
	c.ForceRelease = "alice: " + long
	d := Decide(staging, []Claim{c}, g, at(60), Policy{})
	audit := d.Grant.Audit
	if len(audit) != MaxAuditEntries || !audit[0].At.Equal(at(4)) || audit[len(audit)-1].Kind != AuditForceRelease {
		t.Fatalf("audit of %d entries, from %s to %s, want the newest %d", len(audit), audit[0].At, audit[len(audit)-1].Kind, MaxAuditEntries)
	}
	if r := audit[len(audit)-1].Reason; len(r) > maxAuditTextBytes || !strings.HasPrefix(long, strings.TrimPrefix(r, "alice: ")) {
		t.Errorf("a reason of %d bytes kept as %d bytes", len(c.ForceRelease), len(r))
	}
	size := 0
	for _, e := range audit {
		size += e.Size()
	}
	if size > AuditBytes {
		t.Errorf("the audit takes %d bytes", size)
	}
}

// TestEverySupersessionSaysWhatAndWhatToDo is item 4: each reason's message
// is tested against the situation it describes: it names what actually
// superseded the build, and says what to do.
func TestEverySupersessionSaysWhatAndWhatToDo(t *testing.T) {
	fortyTwoHeld := Grant{Token: 4, Lines: []LineRecord{shopRecord(42, 10, shopPipeline)}}
	for name, tc := range map[string]struct {
		claims []Claim
		grant  Grant
		policy Policy
		claim  string
		want   string
	}{
		"a lower build after a higher one deployed: which, when, and how to roll back": {
			claims: []Claim{shop41}, grant: fortyTwoHeld, claim: "shop-41",
			want: "Build 42 of acme/shop@main already deployed: it held staging at 2026-03-02T09:10:00Z, and a line never deploys " +
				"backwards, so this older build 41 will not deploy. Stop this pipeline; to deploy build 41 again on purpose, roll back: " +
				`kubectl buildlock acquire --rollback --reason "..." (spec.rollback).`,
		},
		"a re-run where the policy refuses re-runs": {
			claims: []Claim{shop42}, grant: fortyTwoHeld, policy: Policy{RefuseReruns: true}, claim: "shop-42",
			want: "Build 42 of acme/shop@main already deployed: it held staging at 2026-03-02T09:10:00Z, and the BuildLockPolicy of " +
				"staging refuses re-runs (spec.reruns: Refused), so this run of it will not deploy. Stop this pipeline; deploy with a new " +
				`build number, or roll back on purpose: kubectl buildlock acquire --rollback --reason "..." (spec.rollback).`,
		},
		"a run of a build that waits, by another run": {
			claims: []Claim{held(web5, 7), waiting(shop42), claim("shop-42-rerun", shop, 42, 50)}, grant: webHolds, claim: "shop-42-rerun",
			want: "Build 42 of acme/shop@main waits for staging as BuildLock shop-42, another run of the same build: two runs of one " +
				"build never deploy at once, so this one will not. Stop this run; re-run it once that one has ended, if it must deploy again.",
		},
		"a run of a build that is queued, by another run": {
			claims: []Claim{held(web5, 7), queuedAt(shop42, 40), claim("shop-42-rerun", shop, 42, 50)}, grant: webHolds, policy: queue,
			claim: "shop-42-rerun",
			want: "Build 42 of acme/shop@main is queued for staging as BuildLock shop-42, another run of the same build: two runs of " +
				"one build never deploy at once, so this one will not. Stop this run; re-run it once that one has ended, if it must deploy again.",
		},
		"a newer build of another line took the single waiting slot": {
			claims: []Claim{held(web5, 7), shop42, claim("dev-7", shopDev, 7, 50)}, grant: webHolds, claim: "shop-42",
			want: "Build 7 of acme/shop@dev is newer and waits for staging: with the ordering NewestWins one build waits, the newest, " +
				"and this build will not deploy. Stop this pipeline; for every build to deploy in its turn, give staging a " +
				"BuildLockPolicy with the ordering Queue or Fifo.",
		},
		"a rollback superseded by a newer build of its line is told to roll back later": {
			claims: []Claim{held(web5, 7), rollback(shop41, "bad"), shop43}, grant: webHolds, claim: "shop-41",
			want: "Build 43 of acme/shop@main is newer and waits for staging: it deploys instead, and this build will not. Stop this " +
				"pipeline; roll back once that build has deployed, if you still must.",
		},
		"a rollback where the policy allows none": {
			claims: []Claim{rollback(shop41, "bad")}, grant: fortyTwoHeld, policy: Policy{Rollbacks: RollbacksNobody}, claim: "shop-41",
			want: "Build 41 of acme/shop@main is a rollback (spec.rollback), and the BuildLockPolicy of staging allows no rollbacks " +
				"(spec.rollbacks: Nobody): it will not deploy. Deploy a new build instead, or ask the policy's administrators to allow rollbacks.",
		},
		"a pipeline's rollback where only people may": {
			claims: []Claim{as(rollback(shop41, "bad"), shopPipeline)}, grant: fortyTwoHeld, policy: Policy{Rollbacks: RollbacksPeopleOnly},
			claim: "shop-41",
			want: "Build 41 of acme/shop@main is a rollback (spec.rollback), and the BuildLockPolicy of staging allows rollbacks by " +
				"people only (spec.rollbacks: PeopleOnly), and this claim was created by system:serviceaccount:ci:shop: it will not " +
				`deploy. Have a person roll back: kubectl buildlock acquire --rollback --reason "..." (spec.rollback).`,
		},
		"an unverified rollback where only people may": {
			claims: []Claim{rollback(shop41, "bad")}, grant: fortyTwoHeld, policy: Policy{Rollbacks: RollbacksPeopleOnly}, claim: "shop-41",
			want: "Build 41 of acme/shop@main is a rollback (spec.rollback), and the BuildLockPolicy of staging allows rollbacks by " +
				"people only (spec.rollbacks: PeopleOnly), and this claim's requester is not verified (the API server stamps " +
				"spec.requester only where the enforcement policies are installed): it will not deploy. Have a person roll back: " +
				`kubectl buildlock acquire --rollback --reason "..." (spec.rollback).`,
		},
		"another pipeline's line": {
			claims: []Claim{as(shop43, webPipeline)}, grant: fortyTwoHeld, claim: "shop-43",
			want: "Build 43 of acme/shop@main will not deploy: its branch acme/shop@main belongs to system:serviceaccount:ci:shop, " +
				"which held staging with build 42 at 2026-03-02T09:10:00Z, and this claim was created by system:serviceaccount:ci:web. " +
				"The lines of a branch, whatever their workflows, belong to the pipeline that held one of them last, until " +
				"2026-03-03T09:10:00Z; claim it as that pipeline, or have a person claim it.",
		},
		"a jump too far": {
			claims: []Claim{claim("shop-2000", shop, 2000, 50)}, grant: fortyTwoHeld, claim: "shop-2000",
			want: "Build 2000 of acme/shop@main is more than 1000 above build 42 of its line, which held staging at " +
				"2026-03-02T09:10:00Z: it will not deploy. Until 2026-03-03T09:10:00Z a build of the line may go at most 1000 higher " +
				"(the operator's --max-build-jump); give it a lower build number, or have a person claim it.",
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

// TestNoMessageSaysANewerBuildWillDeployWhenNoneWill: in the three cases of
// issue 22 (a retried deploy, a rollback, a second workflow) as main decides
// them, no message may claim that a newer build will deploy.
func TestNoMessageSaysANewerBuildWillDeployWhenNoneWill(t *testing.T) {
	fiveHundred := Grant{Token: 4, Lines: []LineRecord{shopRecord(500, 10, "")}}
	for name, c := range map[string]Claim{
		"a retried deploy where re-runs are refused": claim("shop-500", shop, 500, 50),
		"a redeploy of an older build":               claim("shop-499", shop, 499, 50),
	} {
		v := verdictOf(Decide(staging, []Claim{c}, fiveHundred, at(60), Policy{RefuseReruns: true}), c.Name)
		if v.Phase != Superseded || strings.Contains(strings.ToLower(v.Message), "newer build will deploy") || !strings.Contains(v.Message, "Build 500") {
			t.Errorf("%s: %s %q", name, short(v), v.Message)
		}
	}
}
