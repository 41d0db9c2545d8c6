package lock

import (
	"errors"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
)

// validClaim is the claim the validation cases change.
var validClaim = Claim{Namespace: "ci", Target: "staging", Repo: "acme/shop", Branch: "main", Build: 42}

// validationCases are changes to validClaim that Validate accepts (wantErr
// "") or refuses with an error containing wantErr. The same cases go to the
// API server (TestTheAPIServerAgreesWithValidate), which must accept and
// refuse exactly the same claims.
var validationCases = map[string]struct {
	change  func(*Claim)
	wantErr string
}{
	"a complete claim is valid":                  {change: func(*Claim) {}},
	"a GitLab nested group is a valid repo":      {change: func(c *Claim) { c.Repo = "group/sub/name" }},
	"a repo of 255 characters is valid":          {change: func(c *Claim) { c.Repo = "a/" + strings.Repeat("r", 253) }},
	"a target of 63 characters is valid":         {change: func(c *Claim) { c.Target = strings.Repeat("t", 63) }},
	"a branch with spaces and Unicode is valid":  {change: func(c *Claim) { c.Branch = "feature/ümlaut 💥 x" }},
	"a branch of 255 two-byte letters is valid":  {change: func(c *Claim) { c.Branch = strings.Repeat("é", 255) }},
	"the largest build is valid":                 {change: func(c *Claim) { c.Build = buildlockv1.MaxBuild }},
	"a pod with a UID is valid":                  {change: func(c *Claim) { c.PodName, c.PodUID = "runner-0", "6f1c7a2e-0000-4000-8000-000000000001" }},
	"an upper-case pod UID is valid":             {change: func(c *Claim) { c.PodName, c.PodUID = "runner-0", "6F1C7A2E-0000-4000-8000-00000000000A" }},
	"a dotted pod name of 253 characters":        {change: func(c *Claim) { c.PodName = strings.Repeat(strings.Repeat("p", 62)+".", 4)[:252] + "p" }},
	"expiresAfter within bounds is valid":        {change: func(c *Claim) { c.ExpiresAfter = time.Minute }},
	"expiresAfter at its lower bound":            {change: func(c *Claim) { c.ExpiresAfter = buildlockv1.MinExpiresAfter }},
	"expiresAfter at its upper bound":            {change: func(c *Claim) { c.ExpiresAfter = buildlockv1.MaxExpiresAfter }},
	"expiresAfter with nanoseconds":              {change: func(c *Claim) { c.ExpiresAfter = 10*time.Second + time.Nanosecond }},
	"a timestamp in a time zone is valid":        {change: func(c *Claim) { c.Timestamp = time.Date(2026, 11, 30, 22, 45, 0, 0, time.FixedZone("", 14*3600)) }},
	"a timestamp in the year 1 is valid":         {change: func(c *Claim) { c.Timestamp = time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC) }},
	"a timestamp in the year 9999 is valid":      {change: func(c *Claim) { c.Timestamp = time.Date(9999, 12, 31, 23, 59, 59, 999999999, time.UTC) }},
	"an explicit name of 253 characters":         {change: func(c *Claim) { c.Name = strings.Repeat("n", 253) }},
	"a missing target says what it is":           {change: func(c *Claim) { c.Target = "" }, wantErr: "namespace the build deploys into"},
	"a target that is no namespace name":         {change: func(c *Claim) { c.Target = "Staging_1" }, wantErr: `target "Staging_1"`},
	"a target that starts with a dash":           {change: func(c *Claim) { c.Target = "-staging" }, wantErr: `target "-staging"`},
	"a target of 64 characters":                  {change: func(c *Claim) { c.Target = strings.Repeat("t", 64) }, wantErr: "at most 63 characters"},
	"a repo without owner":                       {change: func(c *Claim) { c.Repo = "shop" }, wantErr: `repo "shop" must be owner/name`},
	"a repo of 256 characters":                   {change: func(c *Claim) { c.Repo = "a/" + strings.Repeat("r", 254) }, wantErr: "3 to 255 characters"},
	"a repo with a space":                        {change: func(c *Claim) { c.Repo = "acme/my shop" }, wantErr: "must be owner/name"},
	"an empty branch":                            {change: func(c *Claim) { c.Branch = "" }, wantErr: "branch must not be empty"},
	"a branch of 256 characters":                 {change: func(c *Claim) { c.Branch = strings.Repeat("é", 256) }, wantErr: "at most 255 characters, not 256"},
	"a branch with a newline":                    {change: func(c *Claim) { c.Branch = "main\nINFO all good" }, wantErr: "control characters"},
	"a branch with an escape sequence":           {change: func(c *Claim) { c.Branch = "main\x1b[2J" }, wantErr: "control characters"},
	"a branch with DEL":                          {change: func(c *Claim) { c.Branch = "main\x7f" }, wantErr: "control characters"},
	"a branch with a C1 control character":       {change: func(c *Claim) { c.Branch = "main\u0085" }, wantErr: "control characters"},
	"a branch with a bidirectional override":     {change: func(c *Claim) { c.Branch = "main\u202egnp.exe" }, wantErr: "bidirectional"},
	"a build number of zero":                     {change: func(c *Claim) { c.Build = 0 }, wantErr: "build must be a build number"},
	"a negative build number":                    {change: func(c *Claim) { c.Build = -1 }, wantErr: "build must be a build number"},
	"a build number beyond 2^53-1":               {change: func(c *Claim) { c.Build = buildlockv1.MaxBuild + 1 }, wantErr: "build must be a build number"},
	"a pod name with capitals":                   {change: func(c *Claim) { c.PodName = "Runner" }, wantErr: `pod "Runner"`},
	"a pod name of 254 characters":               {change: func(c *Claim) { c.PodName = strings.Repeat("p", 254) }, wantErr: "at most 253 characters"},
	"a pod UID that is no UUID":                  {change: func(c *Claim) { c.PodName, c.PodUID = "runner-0", "abc" }, wantErr: `pod UID "abc"`},
	"a pod UID without dashes":                   {change: func(c *Claim) { c.PodName, c.PodUID = "runner-0", strings.Repeat("a", 32) }, wantErr: "must be a UID"},
	"a pod UID without a pod":                    {change: func(c *Claim) { c.PodUID = "6f1c7a2e-0000-4000-8000-000000000001" }, wantErr: "needs a pod name"},
	"expiresAfter below 10s":                     {change: func(c *Claim) { c.ExpiresAfter = 9 * time.Second }, wantErr: "between 10s and 24h0m0s"},
	"expiresAfter above 24h":                     {change: func(c *Claim) { c.ExpiresAfter = 24*time.Hour + time.Second }, wantErr: "between 10s and 24h0m0s"},
	"a negative expiresAfter":                    {change: func(c *Claim) { c.ExpiresAfter = -time.Minute }, wantErr: "between 10s and 24h0m0s"},
	"expiresAfter on a claim with a pod":         {change: func(c *Claim) { c.PodName, c.ExpiresAfter = "runner-0", time.Minute }, wantErr: "only to a claim without a pod"},
	"a timestamp in the year 10000":              {change: func(c *Claim) { c.Timestamp = time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC) }, wantErr: "years 1 and 9999"},
	"a timestamp in the year 0":                  {change: func(c *Claim) { c.Timestamp = time.Date(0, 6, 1, 0, 0, 0, 0, time.UTC) }, wantErr: "years 1 and 9999"},
	"an explicit name that is no DNS name":       {change: func(c *Claim) { c.Name = "My_Lock" }, wantErr: `name "My_Lock"`},
	"an explicit name of 254 characters":         {change: func(c *Claim) { c.Name = strings.Repeat("n", 254) }, wantErr: "must be no more than 253 characters"},
	"every wrong field is named in one error":    {change: func(c *Claim) { c.Repo, c.Build = "", -1 }, wantErr: "repo must not be empty"},
	"an out-of-zone year 10000 is still refused": {change: func(c *Claim) { c.Timestamp = time.Date(9999, 12, 31, 23, 0, 0, 0, time.FixedZone("", -2*3600)) }, wantErr: "years 1 and 9999"},
	"a GitHub workflow is valid":                 {change: func(c *Claim) { c.Workflow = "acme/shop/.github/workflows/deploy.yml" }},
	"a workflow of 255 characters is valid":      {change: func(c *Claim) { c.Workflow = strings.Repeat("w", 255) }},
	"a workflow of 256 characters":               {change: func(c *Claim) { c.Workflow = strings.Repeat("w", 256) }, wantErr: "workflow must be at most 255 characters"},
	"a workflow with a newline":                  {change: func(c *Claim) { c.Workflow = "deploy\nx" }, wantErr: "control characters"},
	"a rollback with a reason is valid":          {change: func(c *Claim) { c.Rollback = &buildlockv1.Rollback{Reason: "INC-7: 42 breaks checkout"} }},
	"a rollback reason of 256 characters":        {change: func(c *Claim) { c.Rollback = &buildlockv1.Rollback{Reason: strings.Repeat("é", 256)} }},
	"a rollback without a reason":                {change: func(c *Claim) { c.Rollback = &buildlockv1.Rollback{} }, wantErr: "rollback reason: say why"},
	"a rollback with a blank reason":             {change: func(c *Claim) { c.Rollback = &buildlockv1.Rollback{Reason: "  "} }, wantErr: "rollback reason: say why"},
	"a rollback reason of 257 characters":        {change: func(c *Claim) { c.Rollback = &buildlockv1.Rollback{Reason: strings.Repeat("é", 257)} }, wantErr: "257 characters"},
	"a rollback reason with a newline":           {change: func(c *Claim) { c.Rollback = &buildlockv1.Rollback{Reason: "a\nb"} }, wantErr: "control characters"},
}

func TestValidate(t *testing.T) {
	for name, tc := range validationCases {
		t.Run(name, func(t *testing.T) {
			c := validClaim
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

// TestValidateWhatOnlyTheClientChecks covers what the API server does not
// see in a BuildLock's spec: the namespace (it is where the request goes)
// and the run id (an annotation).
func TestValidateWhatOnlyTheClientChecks(t *testing.T) {
	tests := map[string]struct {
		change  func(*Claim)
		wantErr string
	}{
		"a run id of the longest length":    {change: func(c *Claim) { c.RunID = strings.Repeat("r", buildlockv1.MaxRunIDLength) }},
		"a missing namespace is named":      {change: func(c *Claim) { c.Namespace = "" }, wantErr: "namespace must not be empty"},
		"a namespace that is no DNS label":  {change: func(c *Claim) { c.Namespace = "c.i" }, wantErr: `namespace "c.i"`},
		"a run id that is too long":         {change: func(c *Claim) { c.RunID = strings.Repeat("r", buildlockv1.MaxRunIDLength+1) }, wantErr: "run id"},
		"a run id with a control character": {change: func(c *Claim) { c.RunID = "1\n2" }, wantErr: "without control characters"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			c := validClaim
			tc.change(&c)
			err := c.Validate()
			if (err == nil) != (tc.wantErr == "") || err != nil && !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("Validate() = %v, want an error containing %q", err, tc.wantErr)
			}
		})
	}
}

func TestBuildLockCarriesTheClaim(t *testing.T) {
	ts := time.Date(2026, 3, 1, 12, 0, 0, 123456789, time.UTC)
	c := Claim{Namespace: "ci", Target: "staging", Repo: "acme/shop", Branch: "main", Build: 42,
		PodName: "runner-0", PodUID: "6f1c7a2e-0000-4000-8000-000000000001", Timestamp: ts, RunID: "77-1"}
	bl := c.BuildLock()
	if bl.Name != "acme-shop-main-42-staging" || bl.Namespace != "ci" || RunIDOf(bl) != "77-1" {
		t.Errorf("BuildLock is %s/%s with run id %q", bl.Namespace, bl.Name, RunIDOf(bl))
	}
	s := bl.Spec
	if s.Target != "staging" || s.Repo != "acme/shop" || s.Branch != "main" || s.Build != 42 ||
		s.PodRef == nil || s.PodRef.Name != "runner-0" || s.PodRef.UID != c.PodUID ||
		s.Timestamp == nil || !s.Timestamp.Equal(ts) || s.ExpiresAfter != nil || s.RenewTime != nil {
		t.Errorf("spec = %+v", s)
	}
	if !sameClaim(bl, c) || !c.ownsByPod(bl) {
		t.Error("a claim's own BuildLock is not the same claim, or does not name its pod")
	}
}

func TestSameClaim(t *testing.T) {
	c := Claim{Namespace: "ci", Target: "staging", Repo: "acme/shop", Branch: "main", Build: 42}
	existing := func(change func(*buildlockv1.BuildLockSpec)) *buildlockv1.BuildLock {
		bl := c.BuildLock()
		change(&bl.Spec)
		return bl
	}
	tests := map[string]struct {
		bl    *buildlockv1.BuildLock
		claim Claim
		want  bool
	}{
		"the same identity": {bl: existing(func(*buildlockv1.BuildLockSpec) {}), claim: c, want: true},
		"a renewed claim is the same claim": {bl: existing(func(s *buildlockv1.BuildLockSpec) {
			s.RenewTime = buildlockv1.NewTimestamp(time.Now())
		}), claim: c, want: true},
		"an expiresAfter the claim does not set": {bl: existing(func(s *buildlockv1.BuildLockSpec) {
			s.ExpiresAfter = &metav1.Duration{Duration: time.Hour}
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

// TestARunIDAloneProvesNothing: only a pod's UID makes a claim this run's
// without a proof; a run id, which anyone can copy and two jobs can share,
// never does.
func TestARunIDAloneProvesNothing(t *testing.T) {
	const uid = "6f1c7a2e-0000-4000-8000-000000000001"
	run := Claim{Namespace: "ci", Target: "staging", Repo: "acme/shop", Branch: "main", Build: 42, RunID: "100-1"}
	inPod := run
	inPod.PodName, inPod.PodUID, inPod.RunID = "runner-0", uid, "another-run-id"
	tests := map[string]struct {
		existing *buildlockv1.BuildLock
		claim    Claim
		want     bool
	}{
		"the same run id": {existing: run.BuildLock(), claim: run},
		"the same pod by UID, whatever the run id": {existing: func() *buildlockv1.BuildLock {
			c := inPod
			c.RunID = "first"
			return c.BuildLock()
		}(), claim: inPod, want: true},
		"the same pod name with another UID": {existing: func() *buildlockv1.BuildLock {
			c := inPod
			c.PodUID, c.RunID = "6f1c7a2e-0000-4000-8000-000000000002", "first"
			return c.BuildLock()
		}(), claim: inPod},
		"a claim without a pod, for a claim in a pod": {existing: run.BuildLock(), claim: inPod},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := tc.claim.ownsByPod(tc.existing); got != tc.want {
				t.Errorf("ownsByPod() = %v, want %v", got, tc.want)
			}
		})
	}
}
