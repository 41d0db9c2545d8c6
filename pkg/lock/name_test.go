package lock

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"
)

func TestName(t *testing.T) {
	long := strings.Repeat("very-long-repository-name-", 10)
	tests := map[string]struct {
		claim Claim
		want  string
	}{
		"a simple claim reads as repo, branch, build and target": {
			claim: Claim{Target: "staging", Repo: "acme/shop", Branch: "main", Build: 42},
			want:  "acme-shop-main-42-staging",
		},
		"upper case, slashes and underscores become lower case and dashes": {
			claim: Claim{Target: "prod", Repo: "Acme_Corp/Web.Shop", Branch: "feature/JIRA-123_new", Build: 7},
			want:  "acme-corp-web-shop-feature-jira-123-new-7-prod",
		},
		"runs of odd characters collapse into one dash and ends are trimmed": {
			claim: Claim{Target: "qa", Repo: "--acme//shop--", Branch: "  ümlaut💥branch!! ", Build: 1},
			want:  "acme-shop-mlaut-branch-1-qa",
		},
		"an explicit name wins": {
			claim: Claim{Target: "staging", Repo: "acme/shop", Branch: "main", Build: 42, Name: "my-lock"},
			want:  "my-lock",
		},
		"a name of exactly 63 characters is kept whole": {
			claim: Claim{Target: "t", Repo: "a/" + strings.Repeat("b", 52), Branch: "c", Build: 1},
			want:  "a-" + strings.Repeat("b", 52) + "-c-1-t",
		},
		"a long name keeps build and target and ends in a hash": {
			claim: Claim{Target: "staging", Repo: "acme/" + long, Branch: "main", Build: 4711},
			want:  "acme-very-long-repository-name-very-long-4711-staging-07844a41",
		},
		"the example of Name's doc comment": {
			claim: Claim{Target: "staging", Repo: "acme/frontend-monorepo", Branch: "feature/payments-v2-with-a-very-long-name", Build: 4711},
			want:  "acme-frontend-monorepo-feature-payments-v-4711-staging-dd60ef1d",
		},
		"nothing usable gives a hashed buildlock name": {
			claim: Claim{Repo: "///", Branch: "!!!"},
			want:  "buildlock-fe4896fd",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got := Name(tc.claim)
			if got != tc.want {
				t.Errorf("Name() = %q, want %q", got, tc.want)
			}
			if tc.claim.Name == "" {
				assertGoodName(t, got)
			}
		})
	}
}

func TestNameKeepsBuildAndTargetWhenTruncated(t *testing.T) {
	c := Claim{Target: strings.Repeat("t", 63), Repo: strings.Repeat("r", 200) + "/x", Branch: strings.Repeat("b", 255), Build: 9223372036854775807}
	got := Name(c)
	assertGoodName(t, got)
	if !strings.Contains(got, "-9223372036854775807-") {
		t.Errorf("Name() = %q lost the build number", got)
	}
}

func TestNameTellsApartIdentitiesThatTruncateAlike(t *testing.T) {
	base := Claim{Target: "staging", Repo: "acme/" + strings.Repeat("x", 80), Branch: "main", Build: 1}
	other := base
	other.Branch = "main2"
	if Name(base) == Name(other) {
		t.Errorf("two identities share the name %q", Name(base))
	}
}

// TestFallbackNamesCannotBePredicted: a fallback name reads like the
// claim's name but ends in a random suffix, so that nobody can create it
// beforehand.
func TestFallbackNamesCannotBePredicted(t *testing.T) {
	long := Claim{Target: "staging", Repo: "acme/" + strings.Repeat("x", 80), Branch: "main", Build: 4711}
	for _, c := range []Claim{{Target: "staging", Repo: "acme/shop", Branch: "main", Build: 42}, long} {
		seen := map[string]bool{}
		for range 50 {
			n := fallbackName(c)
			assertGoodName(t, n)
			base := Name(c)[:min(len(Name(c)), MaxNameLength-6)]
			if !strings.HasPrefix(n, strings.TrimRight(base, "-")+"-") || len(n) != len(strings.TrimRight(base, "-"))+6 {
				t.Errorf("fallback name %q is not %q and a suffix", n, base)
			}
			seen[n] = true
		}
		if len(seen) < 45 {
			t.Errorf("50 fallback names of %+v gave only %d different ones", c, len(seen))
		}
	}
}

func assertGoodName(t *testing.T, name string) {
	t.Helper()
	if msgs := validation.IsDNS1123Label(name); len(msgs) > 0 {
		t.Errorf("name %q is not a DNS label: %v", name, msgs)
	}
	if len(name) > MaxNameLength {
		t.Errorf("name %q is %d characters long, more than %d", name, len(name), MaxNameLength)
	}
}

// FuzzName checks that every claim, however odd, gets a valid, bounded,
// deterministic name that keeps its build number.
func FuzzName(f *testing.F) {
	f.Add("staging", "acme/shop", "main", int64(42))
	f.Add("", "", "", int64(0))
	f.Add("prod", "Acme_Corp/Web.Shop", "feature/JIRA-123_ümlaut", int64(-5))
	f.Add(strings.Repeat("t", 100), strings.Repeat("r/", 100), strings.Repeat("b", 300), int64(9223372036854775807))
	f.Fuzz(func(t *testing.T, target, repo, branch string, build int64) {
		c := Claim{Target: target, Repo: repo, Branch: branch, Build: build}
		name := Name(c)
		assertGoodName(t, name)
		if name != Name(c) {
			t.Fatalf("Name is not deterministic for %+v", c)
		}
		fb := fallbackName(c)
		assertGoodName(t, fb)
		if build > 0 && !strings.Contains("-"+name+"-", "-"+buildPart(build)+"-") {
			t.Errorf("Name(%+v) = %q lost the build number", c, name)
		}
	})
}
