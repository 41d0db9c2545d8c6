package arbiter

import (
	"strings"
	"testing"
	"time"
)

// A holiday freeze over staging from minute 50 to minute 120 (rule 12).
var (
	berlin  = time.FixedZone("CET", 3600)
	holiday = Freeze{Frozen: true, Until: at(120).In(berlin), Window: "holiday", Reason: "holiday freeze"}
	frozen  = Policy{Freeze: holiday}
)

// overridden gives c a person's override that expires at minute.
func overridden(c Claim, minute int) Claim {
	c.Override = Override{Reason: "hotfix for incident 4711", By: "alice@example.com", Expires: at(minute)}
	return c
}

// unverifiedOverride gives c an override that expires at minute 90, whose
// stamp by is not a person's verified name ("": nothing verified it).
func unverifiedOverride(c Claim, by string) Claim {
	c = overridden(c, 90)
	c.Override.By = by
	return c
}

func TestAFrozenTargetTakesNoGrant(t *testing.T) {
	releasing := Policy{Freeze: holiday}
	releasing.Freeze.ReleaseSince, releasing.Freeze.ReleaseWindow = at(50), "holiday"
	runDecideCases(t, map[string]decideCase{
		"a free frozen lock grants nobody: the claim waits, Frozen": {
			claims: []Claim{shop1},
			policy: frozen,
			want:   map[string]string{"shop-41": "Waiting Frozen"},
			holder: "", waiting: "shop-41",
		},
		"the holder at the freeze's start keeps the lock; the next waits": {
			claims: []Claim{held(shop1, 1), web7},
			grant:  shopHolds, policy: frozen,
			want:   map[string]string{"shop-41": "Held Acquired", "web-7": "Waiting Frozen"},
			holder: "shop-41", waiting: "web-7", token: 1,
		},
		"a hand-off during a freeze grants nobody": {
			claims: []Claim{withPod(held(shop1, 1), PodFinished), web7},
			grant:  shopHolds, policy: frozen,
			want:   map[string]string{"shop-41": "Released PodFinished", "web-7": "Waiting Frozen"},
			holder: "", waiting: "web-7", grantChanged: true, token: 1,
		},
		"with holder: Release a holder granted before the freeze is released": {
			claims: []Claim{held(shop1, 1), web7},
			grant:  shopHolds, policy: releasing,
			want:   map[string]string{"shop-41": "Released FreezeStarted", "web-7": "Waiting Frozen"},
			holder: "", waiting: "web-7", grantChanged: true, token: 1,
		},
		"with holder: Release a holder granted after the freeze began keeps it": {
			claims: []Claim{held(shop1, 1), web7},
			grant:  grantTo(shop1, 1, 55), policy: releasing,
			want:   map[string]string{"shop-41": "Held Acquired", "web-7": "Waiting Frozen"},
			holder: "shop-41", waiting: "web-7", token: 1,
		},
		"Queue keeps every place through a freeze": {
			claims: []Claim{queuedAt(web7, 40), queuedAt(api3, 41)},
			policy: Policy{Ordering: Queue, Freeze: holiday},
			want:   map[string]string{"web-7": "Waiting Frozen", "api-3": "Waiting Frozen"},
			holder: "", waiting: "web-7",
		},
		"an override in effect is granted through the freeze": {
			claims: []Claim{overridden(shop1, 90)},
			policy: frozen,
			want:   map[string]string{"shop-41": "Held Acquired"},
			holder: "shop-41", grantChanged: true, token: 1,
		},
		"an override goes ahead of the queue the freeze holds back, which keeps its order": {
			claims: []Claim{queuedAt(web7, 40), queuedAt(overridden(api3, 90), 41), queuedAt(claim("db-1", "acme/db@main", 1, 42), 42)},
			policy: Policy{Ordering: Fifo, Freeze: holiday},
			want:   map[string]string{"web-7": "Waiting Frozen", "api-3": "Held Acquired", "db-1": "Waiting Frozen"},
			holder: "api-3", waiting: "web-7", grantChanged: true, token: 1,
		},
		"an override pre-empts no holder: it waits, not Frozen": {
			claims: []Claim{held(shop1, 1), overridden(web7, 90)},
			grant:  shopHolds, policy: frozen,
			want:   map[string]string{"shop-41": "Held Acquired", "web-7": "Waiting WaitingForHolder"},
			holder: "shop-41", waiting: "web-7", token: 1,
		},
		"an expired override does not apply": {
			claims: []Claim{overridden(shop1, 59)},
			policy: frozen,
			want:   map[string]string{"shop-41": "Waiting Frozen"},
			holder: "", waiting: "shop-41",
		},
		"an override expiring more than a day ahead does not apply": {
			claims: []Claim{overridden(shop1, 60+25*60)},
			policy: frozen,
			want:   map[string]string{"shop-41": "Waiting Frozen"},
			holder: "", waiting: "shop-41",
		},
		"a holder with an override is not released by holder: Release": {
			claims: []Claim{overridden(held(shop1, 1), 90), web7},
			grant:  shopHolds, policy: releasing,
			want:   map[string]string{"shop-41": "Held Acquired", "web-7": "Waiting Frozen"},
			holder: "shop-41", waiting: "web-7", token: 1,
		},
		"an override nothing verified does not apply (issue 31: a pipeline's own annotation)": {
			claims: []Claim{unverifiedOverride(shop1, "")},
			policy: frozen,
			want:   map[string]string{"shop-41": "Waiting Frozen"},
			holder: "", waiting: "shop-41",
		},
		"an override stamped with a service account's name does not apply": {
			claims: []Claim{unverifiedOverride(shop1, "system:serviceaccount:ci:pipeline")},
			policy: frozen,
			want:   map[string]string{"shop-41": "Waiting Frozen"},
			holder: "", waiting: "shop-41",
		},
		"a holder whose override nothing verified is released by holder: Release": {
			claims: []Claim{unverifiedOverride(held(shop1, 1), ""), web7},
			grant:  shopHolds, policy: releasing,
			want:   map[string]string{"shop-41": "Released FreezeStarted", "web-7": "Waiting Frozen"},
			holder: "", waiting: "web-7", grantChanged: true, token: 1,
		},
		"an open target grants as ever": {
			claims: []Claim{shop1},
			want:   map[string]string{"shop-41": "Held Acquired"},
			holder: "shop-41", grantChanged: true, token: 1,
		},
	})
}

func TestFreezeMessages(t *testing.T) {
	d := input{claims: []Claim{shop1}, now: at(60), policy: frozen}.decide()
	want := "staging is frozen until 2026-03-02T12:00:00+01:00 (holiday freeze); this build keeps its place"
	if got := verdictOf(d, "shop-41").Message; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	d = input{claims: []Claim{overridden(shop1, 90)}, now: at(60), policy: frozen}.decide()
	v := verdictOf(d, "shop-41")
	if !v.Overridden || !strings.Contains(v.Message, `overridden by "alice@example.com" ("hotfix for incident 4711")`) {
		t.Errorf("overridden=%v message %q", v.Overridden, v.Message)
	}
	// The override is used up by the grant: once held, it is not Overridden again.
	again := input{claims: []Claim{overridden(held(shop1, 1), 90)}, grant: grantTo(shop1, 1, 60), now: at(61), policy: frozen}.decide()
	if verdictOf(again, "shop-41").Overridden {
		t.Errorf("an override counted twice")
	}
	// A waiting claim whose override comes into effect later is looked at then.
	later := input{claims: []Claim{overridden(shop1, 60+24*60+30)}, now: at(60), policy: frozen}.decide()
	if want := at(90); !later.NextLook.Equal(want) {
		t.Errorf("NextLook %s, want %s", later.NextLook, want)
	}
	for _, f := range []Freeze{{Frozen: true, Invalid: true}, {Frozen: true, Until: at(120)}, {Frozen: true}} {
		if got := f.Describe(); got == "" || strings.Contains(got, "()") {
			t.Errorf("Describe(%+v) = %q", f, got)
		}
	}
}

// Issue 31: an override counts only when the API server verified that a
// person set it, says so when it does not, is recorded in the grant
// record's audit when it lets a claim through, and its hold's message has
// one "until": the hold's.
func TestOverridesAreVerifiedAudited(t *testing.T) {
	for by, want := range map[string]string{
		"":                                  `Its override ("hotfix for incident 4711") does not apply: nothing verified who set it.`,
		"system:serviceaccount:ci:pipeline": `Its override by "system:serviceaccount:ci:pipeline" ("hotfix for incident 4711") does not apply: that is a pipeline's identity`,
	} {
		d := input{claims: []Claim{unverifiedOverride(shop1, by)}, now: at(60), policy: frozen}.decide()
		v := verdictOf(d, "shop-41")
		if v.Overridden || !strings.Contains(v.Message, want) {
			t.Errorf("by %q: overridden=%v message %q, want it to contain %q", by, v.Overridden, v.Message, want)
		}
		if !d.NextLook.IsZero() {
			t.Errorf("by %q: NextLook %s: a void override changes nothing in time", by, d.NextLook)
		}
	}

	podless := overridden(shop1, 90)
	podless.Pod, podless.ExpiresAfter = NoPod, 10*time.Minute
	d := input{claims: []Claim{podless}, now: at(60), policy: frozen}.decide()
	v := verdictOf(d, "shop-41")
	want := `Holding staging with fencing token 1 until 2026-03-02T10:10:00Z unless spec.renewTime is bumped, through its freeze ` +
		`(holiday freeze): overridden by "alice@example.com" ("hotfix for incident 4711"); deploy now and delete this BuildLock when done.`
	if v.Message != want {
		t.Errorf("held through the freeze:\n got %q\nwant %q", v.Message, want)
	}
	if n := strings.Count(v.Message, "until"); n != 1 {
		t.Errorf("%d times \"until\" in %q", n, v.Message)
	}
	wantAudit := AuditEntry{Kind: AuditOverride, At: at(60), Name: "shop-41", Repo: "acme/shop", Branch: "main", Build: 41, Token: 1,
		By: "alice@example.com", Reason: "Frozen: hotfix for incident 4711"}
	if len(d.Grant.Audit) != 1 || !d.Grant.Audit[0].equal(wantAudit) {
		t.Errorf("audit %+v, want [%+v]", d.Grant.Audit, wantAudit)
	}

	// A grant while the target is open records nothing, override or not.
	open := input{claims: []Claim{overridden(shop1, 90)}, now: at(60)}.decide()
	if len(open.Grant.Audit) != 0 {
		t.Errorf("an open target's grant audited: %+v", open.Grant.Audit)
	}
}
