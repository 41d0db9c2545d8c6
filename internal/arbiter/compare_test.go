package arbiter

import (
	"fmt"
	"testing"
)

func TestNewerCriteriaInOrder(t *testing.T) {
	for name, tc := range map[string]struct {
		a, b Claim
	}{
		"the later order time is newer, even against a waiting claim": {
			a: claim("z", web, 1, 11), b: waiting(claim("a", shop, 1, 10)),
		},
		"on equal order times the waiting claim is newer": {
			a: waiting(claim("z", web, 1, 10)), b: claim("a", shop, 1, 10),
		},
		"on equal order times and phases the smaller name is newer": {
			a: claim("a", web, 1, 10), b: claim("b", shop, 1, 10),
		},
		"on equal names the smaller UID is newer": {
			a: func() Claim { c := claim("a", web, 1, 10); c.UID = "1"; return c }(),
			b: func() Claim { c := claim("a", web, 1, 10); c.UID = "2"; return c }(),
		},
	} {
		t.Run(name, func(t *testing.T) {
			if !(Policy{}).Newer(tc.a, tc.b) || (Policy{}).Newer(tc.b, tc.a) {
				t.Errorf("Newer(a, b)=%v Newer(b, a)=%v, want true, false", (Policy{}).Newer(tc.a, tc.b), (Policy{}).Newer(tc.b, tc.a))
			}
		})
	}
}

// randomRivals draws claims from a tiny space so that every tie occurs.
func randomRival(ch chooser) Claim {
	c := claim(fmt.Sprintf("c%d", ch.intn(3)), genLines[ch.intn(len(genLines))], int64(1+ch.intn(3)), ch.intn(3))
	c.UID = fmt.Sprintf("u%d", ch.intn(2))
	c.Created = at(ch.intn(3))
	c.Phase = []Phase{Pending, Waiting, ""}[ch.intn(3)]
	return c
}

// checkStrictTotalOrder checks a comparison over random triples:
// irreflexive, antisymmetric, total on distinct identities, transitive.
func checkStrictTotalOrder(t *testing.T, compare func(a, b *Claim) int) {
	t.Helper()
	less := func(a, b *Claim) bool { return compare(a, b) < 0 }
	ch := seeded(7)
	for range 50_000 {
		ra, rb, rc := randomRival(ch), randomRival(ch), randomRival(ch)
		a, b, c := &ra, &rb, &rc
		switch {
		case less(a, a):
			t.Fatalf("not irreflexive: %+v", a)
		case less(a, b) && less(b, a):
			t.Fatalf("not antisymmetric:\n%+v\n%+v", a, b)
		case (compare(a, b) == 0) != (compare(b, a) == 0):
			t.Fatalf("ties not symmetric:\n%+v\n%+v", a, b)
		case compareIdentity(a, b) != 0 && compare(a, b) == 0:
			t.Fatalf("not total:\n%+v\n%+v", a, b)
		case less(a, b) && less(b, c) && !less(a, c):
			t.Fatalf("not transitive:\n%+v\n%+v\n%+v", a, b, c)
		case compare(a, b) == 0 && compare(b, c) == 0 && compare(a, c) != 0:
			t.Fatalf("ties not transitive:\n%+v\n%+v\n%+v", a, b, c)
		}
	}
}

func TestNewerIsAStrictTotalOrder(t *testing.T) {
	checkStrictTotalOrder(t, Policy{}.compareNewer)
	ch := seeded(8)
	for range 10_000 {
		if a, b := randomRival(ch), randomRival(ch); (Policy{}).Newer(a, b) != ((Policy{}).compareNewer(&a, &b) < 0) {
			t.Fatalf("Newer disagrees with compareNewer:\n%+v\n%+v", a, b)
		}
	}
}

func TestInLineOrderIsAStrictTotalOrder(t *testing.T) {
	checkStrictTotalOrder(t, compareInLine)
}
