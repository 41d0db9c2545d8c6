package arbiter

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// Issue 31: what a client writes never widens anyone's rights. These tests
// use only what main's arbiter had, so that each fails on main.

// strict refuses rollbacks and re-runs (break 5's policy).
var strict = Policy{Rollbacks: RollbacksNobody, RefuseReruns: true}

// TestAWorkflowNameEscapesNothing is break 5: spec.workflow is free text,
// and build 41 "of workflow x", or build 42 "of workflow y", must not
// deploy after build 42 of acme/shop@main did, where the policy refuses
// rollbacks and re-runs.
func TestAWorkflowNameEscapesNothing(t *testing.T) {
	fortyTwoHeld := Grant{Token: 4, Lines: []LineRecord{shopRecord(42, 10, shopPipeline)}}
	x41 := as(ofWorkflow(claim("shop-41-x", shop, 41, 50), "x"), shopPipeline)
	y42 := as(ofWorkflow(claim("shop-42-y", shop, 42, 50), "y"), shopPipeline)
	for _, policy := range []Policy{strict, {}, queue, fifo} {
		name := fmt.Sprintf("%s/reruns refused %v: ", policy.Ordering, policy.RefuseReruns)
		cases := map[string]decideCase{
			name + "build 41 is refused": {
				claims: []Claim{as(shop41, shopPipeline)}, grant: fortyTwoHeld, policy: policy,
				want:  map[string]string{"shop-41": "Superseded SupersededByNewerBuild"},
				token: 4,
			},
			name + "build 41 of a workflow nothing verified is refused too": {
				claims: []Claim{x41}, grant: fortyTwoHeld, policy: policy,
				want:  map[string]string{"shop-41-x": "Superseded SupersededByNewerBuild"},
				token: 4,
			},
			name + "build 41 of such a workflow is refused while 42 holds": {
				claims: []Claim{as(heldSince(shop42, 4, 10), shopPipeline), x41}, grant: grantTo(shop42, 4, 10), policy: policy,
				want:   map[string]string{"shop-42": "Held Acquired", "shop-41-x": "Superseded SupersededByNewerBuild by=shop-42"},
				holder: "shop-42", token: 4,
			},
			name + "build 42 of such a workflow is another run of 42 while 42 holds": {
				claims: []Claim{as(heldSince(shop42, 4, 10), shopPipeline), y42}, grant: grantTo(shop42, 4, 10), policy: policy,
				want:   map[string]string{"shop-42": "Held Acquired", "shop-42-y": "Superseded DuplicateBuild by=shop-42"},
				holder: "shop-42", token: 4,
			},
		}
		if policy.RefuseReruns {
			cases[name+"build 42 of a workflow nothing verified is a re-run, refused"] = decideCase{
				claims: []Claim{y42}, grant: fortyTwoHeld, policy: policy,
				want:  map[string]string{"shop-42-y": "Superseded DuplicateBuild"},
				token: 4,
			}
		}
		runDecideCases(t, cases)
	}

	// The whole story, one decision after another, as the issue tells it.
	claims := []Claim{as(claim("shop-42", shop, 42, 5), shopPipeline)}
	g := Grant{}
	now := at(5)
	step := func(arrive ...Claim) Decision {
		t.Helper()
		claims = append(claims, arrive...)
		d := Decide(staging, claims, g, now, strict)
		claims, g = d.Apply(claims), d.Grant
		now = now.Add(time.Minute)
		return d
	}
	if d := step(); d.Holder != "shop-42" {
		t.Fatalf("build 42 does not hold:\n%s", d)
	}
	claims[0].Pod = PodFinished
	step()
	for _, c := range []Claim{as(claim("shop-41", shop, 41, 8), shopPipeline), as(ofWorkflow(claim("shop-41-x", shop, 41, 9), "x"), shopPipeline),
		as(ofWorkflow(claim("shop-42-y", shop, 42, 10), "y"), shopPipeline)} {
		if d := step(c); d.Holder != "" {
			t.Errorf("%s holds after build 42 of its branch deployed, under rollbacks: Nobody and reruns: Refused:\n%s", c.Name, d)
		}
	}
}

// TestABranchNeverDeploysAnOlderBuildAfterANewer is break 5 as an
// accident of ordinary CI: two workflows of one repository deploy one
// branch, and the slower one, whose build started first, must not deploy
// its older source after the newer one did.
func TestABranchNeverDeploysAnOlderBuildAfterANewer(t *testing.T) {
	deploy := ofWorkflow(claim("deploy-500", shop, 500, 5), "deploy.yml") // started at minute 5
	hotfix := ofWorkflow(claim("hotfix-12", shop, 12, 3), "hotfix.yml")   // started at minute 3 ...
	hotfix = created(hotfix, 50)                                          // ... and claims at 50
	later := created(ofWorkflow(claim("hotfix-13", shop, 13, 6), "hotfix.yml"), 50)
	deployHeld := inPhase(heldSince(created(deploy, 20), 4, 20), Released)
	// The grant record remembers what the claim shows.
	remembers := Grant{Token: 4, Lines: []LineRecord{{Repo: "acme/shop", Branch: "main", Workflow: "deploy.yml", Build: 500,
		HeldAt: at(20), Token: 4, Started: at(5)}}}
	for _, policy := range []Policy{{}, queue, fifo} {
		name := string(policy.Ordering) + ": "
		runDecideCases(t, map[string]decideCase{
			name + "after the newer build deployed, the older is superseded": {
				claims: []Claim{deployHeld, hotfix}, grant: remembers, policy: policy,
				want:  map[string]string{"deploy-500": "Released (unchanged)", "hotfix-12": "Superseded SupersededByNewerBuild"},
				token: 4,
			},
			name + "a build that started after it deploys": {
				claims: []Claim{deployHeld, later}, grant: remembers, policy: policy,
				want:   map[string]string{"deploy-500": "Released (unchanged)", "hotfix-13": "Held Acquired"},
				holder: "hotfix-13", grantChanged: true, token: 5,
			},
			name + "while the newer build holds, the older is superseded at once": {
				claims: []Claim{heldSince(created(deploy, 20), 4, 20), hotfix}, grant: grantTo(deploy, 4, 20), policy: policy,
				want:   map[string]string{"deploy-500": "Held Acquired", "hotfix-12": "Superseded SupersededByNewerBuild"},
				holder: "deploy-500", token: 4,
			},
			name + "a rollback of the other workflow goes back on purpose": {
				claims: []Claim{deployHeld, rollback(hotfix, "INC-9")}, grant: remembers, policy: policy,
				want:   map[string]string{"deploy-500": "Released (unchanged)", "hotfix-12": "Held Acquired"},
				holder: "hotfix-12", grantChanged: true, token: 5,
			},
		})
	}
	runDecideCases(t, map[string]decideCase{
		"Queue: the newer build granted first supersedes the older queued behind it": {
			claims: []Claim{held(web5, 7), queuedAt(created(deploy, 35), 35), queuedAt(created(later, 36), 34)},
			grant:  webHolds, policy: queue, now: at(60),
			want:   map[string]string{"web-5": "Held Acquired", "deploy-500": "Waiting Queued", "hotfix-13": "Waiting Queued"},
			holder: "web-5", waiting: "hotfix-13", token: 7,
		},
		"Queue: when the newer is granted, the older behind it is superseded by it": {
			claims: []Claim{withPod(held(web5, 7), PodFinished), queuedAt(created(deploy, 35), 35), queuedAt(created(later, 36), 34)},
			grant:  webHolds, policy: queue, now: at(60),
			want: map[string]string{"web-5": "Released PodFinished", "hotfix-13": "Held Acquired",
				"deploy-500": "Superseded SupersededByNewerBuild by=hotfix-13"},
			holder: "hotfix-13", grantChanged: true, token: 8,
		},
	})
}

// TestAWorkflowLineBelongsToItsBranchsOwner is break 6: another team's
// service account cannot take a workflow line of a branch that acme/shop's
// pipeline holds, and so cannot lock that pipeline out of it.
func TestAWorkflowLineBelongsToItsBranchsOwner(t *testing.T) {
	shopHeld := Grant{Token: 4, Lines: []LineRecord{shopRecord(42, 10, shopPipeline)}}
	// The plugin that fills the workflow in numbers acme/shop's builds as
	// before: 43 follows 42.
	squat := as(ofWorkflow(claim("squat-43", shop, 43, 50), "acme/shop/.github/workflows/deploy.yml"), webPipeline)
	own := as(ofWorkflow(claim("deploy-43", shop, 43, 50), "acme/shop/.github/workflows/deploy.yml"), shopPipeline)
	runDecideCases(t, map[string]decideCase{
		"another pipeline's claim of a workflow line of a branch the pipeline holds is refused": {
			claims: []Claim{squat}, grant: shopHeld,
			want:  map[string]string{"squat-43": "Superseded LineOwnedByOther"},
			token: 4,
		},
		"while the branch's owner holds another line of it": {
			claims: []Claim{as(heldSince(shop42, 4, 10), shopPipeline), squat}, grant: grantTo(shop42, 4, 10),
			want:   map[string]string{"shop-42": "Held Acquired", "squat-43": "Superseded LineOwnedByOther"},
			holder: "shop-42", token: 4,
		},
		"the branch's owner opens its workflow lines": {
			claims: []Claim{own}, grant: shopHeld,
			want:   map[string]string{"deploy-43": "Held Acquired"},
			holder: "deploy-43", grantChanged: true, token: 5,
		},
		"with Fifo, another pipeline's claim queued behind the owner's new hold is refused": {
			claims: []Claim{own, as(ofWorkflow(claim("squat-44", shop, 44, 51), "acme/shop/.github/workflows/hotfix.yml"), webPipeline)},
			grant:  Grant{Token: 4}, policy: fifo,
			want:   map[string]string{"deploy-43": "Held Acquired", "squat-44": "Superseded LineOwnedByOther"},
			holder: "deploy-43", grantChanged: true, token: 5,
		},
	})
	// The squatter never holds, so the owner is never locked out.
	claims := []Claim{squat}
	d := Decide(staging, claims, shopHeld, at(50), Policy{})
	claims = d.Apply(claims)
	d = Decide(staging, append(claims, created(own, 51)), d.Grant, at(51), Policy{})
	if v := verdictOf(d, "deploy-43"); v.Phase != Held {
		t.Errorf("the branch's own pipeline is %s after another team claimed its workflow line: %q", short(v), v.Message)
	}
}

// TestALineFloodNeverReopensARollback is break 8: one identity holds line
// after fake line until the memory of lines is full; another team's new
// line must then never deploy its build 4 after its build 5 held, with
// verified identities and without.
func TestALineFloodNeverReopensARollback(t *testing.T) {
	for _, tc := range []struct {
		flooder, victim string
		accounts        int // how many service accounts the flooder has
	}{
		{"system:serviceaccount:ci:intruder", "system:serviceaccount:ci:web", 1},
		{"system:serviceaccount:ci:intruder", "system:serviceaccount:ci:web", 6},
		{"", "", 1},
	} {
		t.Run(fmt.Sprintf("flooder %q (%d), victim %q", tc.flooder, tc.accounts, tc.victim), func(t *testing.T) {
			g, now := Grant{Token: 1}, t0
			long := strings.Repeat("b", 255)
			// About 130 long and 60 short fake lines, each held briefly.
			for k := range 190 {
				branch := long
				if k >= 130 {
					branch = fmt.Sprintf("short-%d", k)
				}
				flooder := tc.flooder
				if flooder != "" {
					flooder += fmt.Sprint(k % tc.accounts)
				}
				c := as(claim(fmt.Sprintf("fake-%d", k), "fake/app@"+branch, 1, 0), flooder)
				c.Workflow = fmt.Sprintf("%s/.github/workflows/%04d.yml", long[:40], k)
				c.Created, c.Timestamp = now, now
				d := Decide(staging, []Claim{c}, g, now, Policy{})
				held := d.Apply([]Claim{c})[0]
				g = Decide(staging, []Claim{withPod(held, PodFinished)}, d.Grant, now, Policy{}).Grant
				now = now.Add(600 * time.Millisecond)
			}
			// Another team's new line: build 5, then build 4.
			var claims []Claim
			granted := map[int64]bool{}
			for _, n := range []int64{5, 4} {
				c := as(claim(fmt.Sprintf("victim-%d", n), "acme/victim@main", n, 0), tc.victim)
				c.Created, c.Timestamp = now, now
				claims = append(claims, c)
				for range 3 {
					d := Decide(staging, claims, g, now, Policy{})
					claims, g = d.Apply(claims), d.Grant
					// A claim that ended is deleted (the plugin deletes its
					// claim when its command is done); the holder deploys and
					// goes.
					claims = slices.DeleteFunc(claims, func(c Claim) bool { return c.Phase.IsTerminal() })
					for k := range claims {
						if claims[k].Name == d.Holder {
							granted[claims[k].Build] = true
							claims[k].Pod = PodFinished
						}
					}
					now = now.Add(time.Second)
				}
			}
			if granted[5] && granted[4] {
				t.Errorf("build 4 of the victim's line was granted after its build 5 held: the flood kept the line from being remembered")
			}
		})
	}
}
