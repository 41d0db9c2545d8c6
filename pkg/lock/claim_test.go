package lock

import (
	"errors"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
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

func TestFallbackNameDiffersFromNameAndByPod(t *testing.T) {
	c := Claim{Target: "staging", Repo: "acme/shop", Branch: "main", Build: 42, PodName: "runner-a"}
	d := c
	d.PodName = "runner-b"
	for _, n := range []string{fallbackName(c), fallbackName(d)} {
		assertGoodName(t, n)
	}
	if fallbackName(c) == Name(c) || fallbackName(c) == fallbackName(d) {
		t.Errorf("fallback names %q and %q must differ from each other and from %q", fallbackName(c), fallbackName(d), Name(c))
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

func TestValidate(t *testing.T) {
	good := Claim{Namespace: "ci", Target: "staging", Repo: "acme/shop", Branch: "main", Build: 42}
	tests := map[string]struct {
		change  func(*Claim)
		wantErr string // "" for valid
	}{
		"a complete claim is valid":               {change: func(*Claim) {}},
		"a GitLab nested group is a valid repo":   {change: func(c *Claim) { c.Repo = "group/sub/name" }},
		"a pod with a UID is valid":               {change: func(c *Claim) { c.PodName, c.PodUID = "runner-0", "6f1c7a2e-0000-4000-8000-000000000001" }},
		"expiresAfter within bounds is valid":     {change: func(c *Claim) { c.ExpiresAfter = time.Minute }},
		"a missing namespace is named":            {change: func(c *Claim) { c.Namespace = "" }, wantErr: "namespace must not be empty"},
		"a missing target says what it is":        {change: func(c *Claim) { c.Target = "" }, wantErr: "namespace the build deploys into"},
		"a target that is no namespace name":      {change: func(c *Claim) { c.Target = "Staging_1" }, wantErr: `target "Staging_1"`},
		"a repo without owner":                    {change: func(c *Claim) { c.Repo = "shop" }, wantErr: `repo "shop" must be owner/name`},
		"an empty branch":                         {change: func(c *Claim) { c.Branch = "" }, wantErr: "branch must not be empty"},
		"a build number of zero":                  {change: func(c *Claim) { c.Build = 0 }, wantErr: "build must be a build number"},
		"a pod name with capitals":                {change: func(c *Claim) { c.PodName = "Runner" }, wantErr: `pod "Runner"`},
		"a pod UID without a pod":                 {change: func(c *Claim) { c.PodUID = "abc" }, wantErr: "needs a pod name"},
		"expiresAfter below 10s":                  {change: func(c *Claim) { c.ExpiresAfter = time.Second }, wantErr: "between 10s and 24h0m0s"},
		"every wrong field is named in one error": {change: func(c *Claim) { c.Repo, c.Build = "", -1 }, wantErr: "repo must not be empty"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			c := good
			tc.change(&c)
			err := c.Validate()
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if !errors.Is(err, ErrInvalidClaim) {
				t.Fatalf("Validate() = %v, want an ErrInvalidClaim", err)
			}
			if !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("Validate() = %q, want it to contain %q", err, tc.wantErr)
			}
		})
	}
}

func TestBuildLockCarriesTheClaim(t *testing.T) {
	ts := time.Date(2026, 3, 1, 12, 0, 0, 123456789, time.UTC)
	c := Claim{Namespace: "ci", Target: "staging", Repo: "acme/shop", Branch: "main", Build: 42,
		PodName: "runner-0", PodUID: "abc-1", Timestamp: ts, ExpiresAfter: 2 * time.Minute}
	bl := c.BuildLock()
	if bl.Name != "acme-shop-main-42-staging" || bl.Namespace != "ci" {
		t.Errorf("BuildLock is %s/%s", bl.Namespace, bl.Name)
	}
	s := bl.Spec
	if s.Target != "staging" || s.Repo != "acme/shop" || s.Branch != "main" || s.Build != 42 ||
		s.PodRef == nil || s.PodRef.Name != "runner-0" || s.PodRef.UID != "abc-1" ||
		s.Timestamp == nil || !s.Timestamp.Equal(ts) ||
		s.ExpiresAfter == nil || s.ExpiresAfter.Duration != 2*time.Minute || s.RenewTime != nil {
		t.Errorf("spec = %+v", s)
	}
	if !sameClaim(bl, c) {
		t.Error("a claim's own BuildLock is not sameClaim")
	}
}

func TestSameClaim(t *testing.T) {
	c := Claim{Namespace: "ci", Target: "staging", Repo: "acme/shop", Branch: "main", Build: 42}
	existing := func(change func(*buildlockv1.BuildLockSpec)) *buildlockv1.BuildLock {
		bl := c.BuildLock()
		// The API server defaults expiresAfter.
		bl.Spec.ExpiresAfter = &metav1.Duration{Duration: time.Hour}
		change(&bl.Spec)
		return bl
	}
	tests := map[string]struct {
		bl    *buildlockv1.BuildLock
		claim Claim
		want  bool
	}{
		"the same identity with the defaulted expiresAfter": {bl: existing(func(*buildlockv1.BuildLockSpec) {}), claim: c, want: true},
		"a renewed claim is the same claim": {bl: existing(func(s *buildlockv1.BuildLockSpec) {
			s.RenewTime = buildlockv1.NewTimestamp(time.Now())
		}), claim: c, want: true},
		"another build":  {bl: existing(func(s *buildlockv1.BuildLockSpec) { s.Build = 41 }), claim: c},
		"another target": {bl: existing(func(s *buildlockv1.BuildLockSpec) { s.Target = "prod" }), claim: c},
		"a pod where the claim has none": {bl: existing(func(s *buildlockv1.BuildLockSpec) {
			s.PodRef = &buildlockv1.PodReference{Name: "p"}
		}), claim: c},
		"another pod": {bl: existing(func(s *buildlockv1.BuildLockSpec) { s.PodRef = &buildlockv1.PodReference{Name: "p"} }),
			claim: func() Claim { d := c; d.PodName = "q"; return d }()},
		"an explicit expiresAfter that differs": {bl: existing(func(*buildlockv1.BuildLockSpec) {}),
			claim: func() Claim { d := c; d.ExpiresAfter = time.Minute; return d }()},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := sameClaim(tc.bl, tc.claim); got != tc.want {
				t.Errorf("sameClaim() = %v, want %v", got, tc.want)
			}
		})
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
