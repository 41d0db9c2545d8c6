package arbiter

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Three apps deploying into one shared namespace, as in the issue that asked
// for Queue: shop holds, api and web arrive a second apart.
var (
	api   = "acme/api@main"
	api3  = claim("api-3", api, 3, 40)
	web7  = claim("web-7", web, 7, 39)
	web8  = claim("web-8", web, 8, 45)
	shop1 = claim("shop-41", shop, 41, 30)

	shopHolds = grantTo(shop1, 1, 30)
	queue     = Policy{Ordering: Queue}
	fifo      = Policy{Ordering: Fifo}
)

func TestQueue(t *testing.T) {
	runDecideCases(t, map[string]decideCase{
		"no app supersedes another: every app's build waits its turn": {
			claims: []Claim{held(shop1, 1), web7, api3},
			grant:  shopHolds, policy: queue,
			want: map[string]string{
				"shop-41": "Held Acquired", "web-7": "Waiting Queued", "api-3": "Waiting Queued",
			},
			holder: "shop-41", waiting: "web-7", token: 1,
		},
		"lines go in the order they joined, not by build time": {
			claims: []Claim{held(shop1, 1), queuedAt(web7, 41), queuedAt(api3, 40)},
			grant:  shopHolds, policy: queue,
			want: map[string]string{
				"shop-41": "Held Acquired", "web-7": "Waiting Queued", "api-3": "Waiting Queued",
			},
			holder: "shop-41", waiting: "api-3", token: 1,
		},
		"a newer build of a queued line takes its place": {
			claims: []Claim{held(shop1, 1), queuedAt(web7, 40), queuedAt(api3, 41), web8},
			grant:  shopHolds, policy: queue,
			want: map[string]string{
				"shop-41": "Held Acquired", "web-7": "Superseded SupersededByNewerBuild by=web-8",
				"web-8": "Waiting Queued", "api-3": "Waiting Queued",
			},
			holder: "shop-41", waiting: "web-8", token: 1,
		},
		"the holder's next build joins at the back": {
			claims: []Claim{held(shop1, 1), queuedAt(web7, 40), claim("shop-42", shop, 42, 50)},
			grant:  shopHolds, policy: queue,
			want: map[string]string{
				"shop-41": "Held Acquired", "web-7": "Waiting Queued", "shop-42": "Waiting Queued",
			},
			holder: "shop-41", waiting: "web-7", token: 1,
		},
		"a hand-off grants the first in the queue": {
			claims: []Claim{withPod(held(shop1, 1), PodFinished), queuedAt(claim("shop-42", shop, 42, 50), 50), queuedAt(web7, 40), queuedAt(api3, 41)},
			grant:  shopHolds, policy: queue,
			want: map[string]string{
				"shop-41": "Released PodFinished", "web-7": "Held Acquired",
				"api-3": "Waiting Queued", "shop-42": "Waiting Queued",
			},
			holder: "web-7", waiting: "api-3", grantChanged: true, token: 2,
		},
		"a lower build of a queued line gives up to it": {
			claims: []Claim{held(shop1, 1), queuedAt(web8, 40), web7},
			grant:  shopHolds, policy: queue,
			want: map[string]string{
				"shop-41": "Held Acquired", "web-8": "Waiting Queued", "web-7": "Superseded SupersededByNewerBuild by=web-8",
			},
			holder: "shop-41", waiting: "web-8", token: 1,
		},
	})
}

func TestFifo(t *testing.T) {
	web9 := claim("web-9", web, 9, 47)
	runDecideCases(t, map[string]decideCase{
		"every build of a line takes its turn in arrival order": {
			claims: []Claim{held(web5, 7), queuedAt(web7, 40), queuedAt(web8, 41), queuedAt(api3, 42), web9},
			grant:  webHolds, policy: fifo,
			want: map[string]string{
				"web-5": "Held Acquired", "web-7": "Waiting Queued", "web-8": "Waiting Queued",
				"api-3": "Waiting Queued", "web-9": "Waiting Queued",
			},
			holder: "web-5", waiting: "web-7", token: 7,
		},
		"a late older build is superseded by the newer one queued ahead": {
			claims: []Claim{held(web5, 7), queuedAt(web8, 40), web7},
			grant:  webHolds, policy: fifo,
			want: map[string]string{
				"web-5": "Held Acquired", "web-8": "Waiting Queued", "web-7": "Superseded SupersededByNewerBuild by=web-8",
			},
			holder: "web-5", waiting: "web-8", token: 7,
		},
		"a duplicate of a queued build is superseded": {
			claims: []Claim{held(web5, 7), queuedAt(web8, 40), claim("web-8-again", web, 8, 50)},
			grant:  webHolds, policy: fifo,
			want: map[string]string{
				"web-5": "Held Acquired", "web-8": "Waiting Queued", "web-8-again": "Superseded DuplicateBuild by=web-8",
			},
			holder: "web-5", waiting: "web-8", token: 7,
		},
		"a build below the holder's is superseded by it": {
			claims: []Claim{held(web8, 7), claim("web-7", web, 7, 50)},
			grant:  grantTo(web8, 7, 30), policy: fifo,
			want:   map[string]string{"web-8": "Held Acquired", "web-7": "Superseded SupersededByNewerBuild by=web-8"},
			holder: "web-8", token: 7,
		},
	})
}

func TestSwitchingOrderings(t *testing.T) {
	queued := []Claim{held(shop1, 1), queuedAt(web7, 40), queuedAt(api3, 41), queuedAt(claim("shop-42", shop, 42, 50), 42)}
	runDecideCases(t, map[string]decideCase{
		"from Queue to NewestWins the newest waiting claim stays and the others give up": {
			claims: queued, grant: shopHolds,
			want: map[string]string{
				"shop-41": "Held Acquired", "shop-42": "Waiting WaitingForHolder",
				"web-7": "Superseded SupersededByNewerBuild by=shop-42", "api-3": "Superseded SupersededByNewerBuild by=shop-42",
			},
			holder: "shop-41", waiting: "shop-42", token: 1,
		},
		"from Queue to Fifo every claim keeps its place": {
			claims: queued, grant: shopHolds, policy: fifo,
			want: map[string]string{
				"shop-41": "Held Acquired", "shop-42": "Waiting Queued", "web-7": "Waiting Queued", "api-3": "Waiting Queued",
			},
			holder: "shop-41", waiting: "web-7", token: 1,
		},
		// Queue keeps one place per line (issue 21, item 14): the newest
		// build of a line takes the line's earliest place, and the line's
		// older builds give up, as they would have had they arrived under
		// Queue.
		"from Fifo to Queue a line's newest build takes the line's earliest place, and its older builds give up": {
			claims: []Claim{held(shop1, 1), queuedAt(web7, 40), queuedAt(api3, 41), queuedAt(claim("web-8", web, 8, 50), 42)},
			grant:  shopHolds, policy: queue,
			want: map[string]string{
				"shop-41": "Held Acquired", "web-8": "Waiting Queued", "api-3": "Waiting Queued",
				"web-7": "Superseded SupersededByNewerBuild by=web-8",
			},
			holder: "shop-41", waiting: "web-8", token: 1,
		},
		"from NewestWins to Queue the waiting claim keeps its place ahead of newcomers": {
			claims: []Claim{held(shop1, 1), queuedAt(web7, 40), api3}, grant: shopHolds, policy: queue,
			want: map[string]string{
				"shop-41": "Held Acquired", "web-7": "Waiting Queued", "api-3": "Waiting Queued",
			},
			holder: "shop-41", waiting: "web-7", token: 1,
		},
	})
}

func TestNeverBackwards(t *testing.T) {
	tenHeld := Grant{Token: 4, Lines: []LineRecord{{Repo: "acme/shop", Branch: "main", Build: 10, HeldAt: at(10)}}}
	shop9, shop10, shop11 := claim("shop-9", shop, 9, 50), claim("shop-10", shop, 10, 50), claim("shop-11", shop, 11, 50)
	for _, policy := range []Policy{{}, queue, fifo} {
		runDecideCases(t, map[string]decideCase{
			string(policy.Ordering) + ": a lower build after a higher one held, its claim gone, is superseded": {
				claims: []Claim{shop9}, grant: tenHeld, policy: policy,
				want:  map[string]string{"shop-9": "Superseded SupersededByNewerBuild"},
				token: 4,
			},
			string(policy.Ordering) + ": a re-run of the build that held last deploys again": {
				claims: []Claim{shop10}, grant: tenHeld, policy: policy,
				want:   map[string]string{"shop-10": "Held Acquired"},
				holder: "shop-10", grantChanged: true, token: 5,
			},
			string(policy.Ordering) + ": a re-run of a build that held does not deploy again where the policy refuses re-runs": {
				claims: []Claim{shop10}, grant: tenHeld, policy: refusingReruns(policy),
				want:  map[string]string{"shop-10": "Superseded DuplicateBuild"},
				token: 4,
			},
			string(policy.Ordering) + ": a higher build is granted and remembered": {
				claims: []Claim{shop11}, grant: tenHeld, policy: policy,
				want:   map[string]string{"shop-11": "Held Acquired"},
				holder: "shop-11", grantChanged: true, token: 5,
			},
			string(policy.Ordering) + ": the memory lasts LineMemory": {
				claims: []Claim{shop9}, grant: tenHeld, now: at(10).Add(DefaultGrantRetention), policy: policy,
				want:   map[string]string{"shop-9": "Held Acquired"},
				holder: "shop-9", grantChanged: true, token: 5,
			},
		})
	}
}

// refusingReruns is p refusing re-runs.
func refusingReruns(p Policy) Policy {
	p.RefuseReruns = true
	return p
}

// TestNoIdentityCanFlushALinesMemory: one identity holds line after fake
// line (issue 21, item 5). The memory stays within its bounds, that
// identity's records within its share, and no record of another line is
// evicted: the victim's lower build is still superseded afterwards. A fake
// line that the memory has no room for is not granted (issue 31, break 8):
// it waits, LineMemoryFull.
func TestNoIdentityCanFlushALinesMemory(t *testing.T) {
	const victim = "system:serviceaccount:ci:shop"
	for _, flooder := range []string{"system:serviceaccount:ci:intruder", "", "alice@example.com"} {
		t.Run("as "+strconv.Quote(flooder), func(t *testing.T) {
			g := Grant{Token: 1, Lines: []LineRecord{{Repo: "acme/shop", Branch: "main", Build: 10, HeldAt: t0, Owner: victim}}}
			now := t0
			long := strings.Repeat("b", 200)
			var refused *Verdict
			for k := range 2000 {
				c := claim(fmt.Sprintf("fake-%d", k), fmt.Sprintf("fake/app-%04d@%s", k, long), 1, 0)
				c.Identity = flooder
				now = now.Add(time.Second)
				d := Decide(staging, []Claim{c}, g, now, Policy{})
				if d.Holder != c.Name {
					v := verdictOf(d, c.Name)
					refused = &v
					break
				}
				g = Decide(staging, []Claim{withPod(d.Apply([]Claim{c})[0], PodFinished)}, d.Grant, now, Policy{}).Grant
			}
			if refused == nil || short(*refused) != "Waiting LineMemoryFull" {
				t.Fatalf("the flood's lines were granted beyond the memory's room, or refused otherwise: %+v", refused)
			}
			size, mine := 0, 0
			for _, r := range g.Lines {
				size += r.Size()
				if r.Owner == flooder {
					mine += r.Size()
				}
			}
			// The flood filled what it may (one more record would not fit),
			// and no more.
			share, filled := LineMemoryBytesPerOwner, mine
			if flooder == "" {
				share, filled = LineMemoryBytes, size
			}
			next := (LineRecord{Repo: "fake/app-0000", Branch: long, Owner: flooder, Token: g.Token, Started: t0}).Size()
			if size > LineMemoryBytes || mine > share || filled+next <= share {
				t.Errorf("the memory takes %d bytes, the flooder's records %d (its share %d)", size, mine, share)
			}
			late := claim("shop-9", shop, 9, 0)
			late.Identity = victim
			d := Decide(staging, []Claim{late}, g, now, Policy{})
			if v := verdictOf(d, "shop-9"); short(v) != "Superseded SupersededByNewerBuild" {
				t.Errorf("after the flood, build 9 of the victim's line is %s; its memory was evicted", short(v))
			}
		})
	}
}

func TestAFarFutureTimestampWinsNothing(t *testing.T) {
	evil := claim("evil-1", "evil/repo@main", 1, 30)
	evil.Timestamp = time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC)
	honest := claim("shop-42", shop, 42, 31) // created a minute later
	runDecideCases(t, map[string]decideCase{
		"a claim created later wins the slot over one stamped in year 9999": {
			claims: []Claim{held(web5, 7), evil, honest},
			grant:  webHolds,
			want: map[string]string{
				"web-5": "Held Acquired", "shop-42": "Waiting WaitingForHolder",
				"evil-1": "Superseded SupersededByNewerBuild by=shop-42",
			},
			holder: "web-5", waiting: "shop-42", token: 7,
		},
	})
	if got, want := (Policy{}).OrderTime(evil), at(30).Add(DefaultMaxTimestampSkew); !got.Equal(want) {
		t.Errorf("OrderTime = %s, want %s", got, want)
	}
	early := claim("early", shop, 1, 30)
	early.Timestamp = at(20)
	if got := (Policy{}).OrderTime(early); !got.Equal(at(20)) {
		t.Errorf("a build that started before its claim: OrderTime = %s, want %s", got, at(20))
	}
}

func TestAnEndingTheGrantRecordedIsKept(t *testing.T) {
	// web-5's hold expired and shop-42 was granted, but web-5's Expired
	// status was never written.
	stale := podless(held(web5, 7), 10*time.Minute)
	g := grantTo(shop42, 8, 41)
	g.Ended = Ending{Name: web5.Name, UID: web5.UID, Phase: Expired, Reason: ReasonExpired, At: at(40)}
	d := Decide(staging, []Claim{stale, held(shop42, 8)}, g, at(41), Policy{})
	v := verdictOf(d, "web-5")
	if short(v) != "Expired Expired" || !strings.Contains(v.Message, "expired at 2026-03-02T09:40:00Z") {
		t.Errorf("got %s: %q", short(v), v.Message)
	}
	g.Ended.UID = "uid-of-another-object"
	if v := verdictOf(Decide(staging, []Claim{stale, held(shop42, 8)}, g, at(41), Policy{}), "web-5"); short(v) != "Released LockLost" {
		t.Errorf("an ending of another object: got %s", short(v))
	}
}

func TestQueuedMessagesNameTheClaimAhead(t *testing.T) {
	d := Decide(staging, []Claim{held(shop1, 1), queuedAt(web7, 40), queuedAt(api3, 41)}, shopHolds, at(60), queue)
	for name, want := range map[string]string{
		"web-7": "Queued for staging behind build 41 of acme/shop@main.",
		"api-3": "Queued for staging behind build 7 of acme/web@main.",
	} {
		if v := verdictOf(d, name); v.Message != want || v.Holder != "" || v.Waiting != "" {
			t.Errorf("%s: %q holder=%q waiting=%q, want %q and neither", name, v.Message, v.Holder, v.Waiting, want)
		}
	}
}

// changedVerdicts counts the claims whose status the decision changes
// compared with the previous decision's verdicts: what the controller would
// write.
func changedVerdicts(prev, next Decision) int {
	before := map[string]Verdict{}
	for _, v := range prev.Verdicts {
		before[v.Name] = v
	}
	changed := 0
	for _, v := range next.Verdicts {
		b, ok := before[v.Name]
		if v.Reason == "" {
			continue
		}
		if !ok || b.Phase != v.Phase || b.Reason != v.Reason || b.Message != v.Message || b.Holder != v.Holder ||
			b.Waiting != v.Waiting || !b.QueuedAt.Equal(v.QueuedAt) || b.FencingToken != v.FencingToken || !b.ExpiresAt.Equal(v.ExpiresAt) {
			changed++
		}
	}
	return changed
}

func TestAHandOffChangesTwoClaimsHoweverLongTheQueue(t *testing.T) {
	for _, lines := range []int{1, 2, 50} {
		for _, policy := range []Policy{queue, fifo} {
			claims := []Claim{held(shop1, 1)}
			for k := range lines {
				claims = append(claims, claim(fmt.Sprintf("app-%02d", k), fmt.Sprintf("acme/app-%02d@main", k), 1, 31+k))
			}
			settled := Decide(staging, claims, shopHolds, at(60), policy)
			claims, grant := settled.Apply(claims), settled.Grant
			again := Decide(staging, claims, grant, at(60), policy)
			if n := changedVerdicts(settled, again); n != 0 {
				t.Fatalf("%d lines, %s: deciding again changed %d claims", lines, policy.Ordering, n)
			}
			claims[0].Pod = PodFinished // the holder finishes
			handOff := Decide(staging, claims, grant, at(61), policy)
			if n := changedVerdicts(again, handOff); n != 2 {
				t.Errorf("%d lines waiting, %s: a hand-off changed %d claims, want 2 (the old and the new holder)\n%s",
					lines, policy.Ordering, n, handOff)
			}
		}
	}
}
