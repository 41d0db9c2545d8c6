package main

// Integration tests of real CI behavior: jobs of one CI run that compute
// the same run id, a plugin killed while its command runs, claims created
// under this build's name by others, and builds acquired by hand.

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
	"github.com/buildlock/buildlock/pkg/lock"
)

// TestTwoJobsThatShareARunIDNeverShareAClaim is issue 21's reproduction: two
// acquires with the same GITHUB_* variables (two matrix jobs of one run,
// which GitHub gives the same run id and attempt) and different commands,
// three seconds apart. The second claims nothing and says how to give each
// job its own run id; the first runs to its end, and the second job's
// release (a step that always runs) leaves the first's claim alone.
func TestTwoJobsThatShareARunIDNeverShareAClaim(t *testing.T) {
	for _, tc := range []struct {
		name    string
		sameDir bool
		want    string
	}{
		{name: "on two runners", want: "has this run's id (run 5005-1) but was not created by this job"},
		{name: "on one runner, in one directory", sameDir: true, want: "Another acquire of this run (run 5005-1) is at work on the claim"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			firstDir, secondDir := filepath.Join(f.dir, "runner-1"), filepath.Join(f.dir, "runner-2")
			if tc.sameDir {
				secondDir = firstDir
			}
			env, cmd := f.helper("first", 10*time.Second, 0)
			first := f.plugin(merge(github(1), env, map[string]string{"RUNNER_TEMP": firstDir}), append([]string{"acquire", "--target", "staging"}, cmd...)...)
			f.started("first")
			claim := f.get("acme-shop-main-42-staging")
			time.Sleep(3 * time.Second)

			env, cmd = f.helper("second", 0, 0)
			code, second := f.run(merge(github(1), env, map[string]string{"RUNNER_TEMP": secondDir}), append([]string{"acquire", "--target", "staging"}, cmd...)...)
			if code != exitOtherRun {
				t.Fatalf("the second job exited %d, want %d; stderr:\n%s", code, exitOtherRun, second.stderr)
			}
			for _, want := range []string{tc.want, "This run claimed nothing.", "give each job its own, with --run-id or the variable BUILDLOCK_RUN_ID"} {
				if !strings.Contains(second.stderr.String(), want) {
					t.Errorf("the second job's stderr does not say %q:\n%s", want, second.stderr)
				}
			}
			if _, ran := f.helperRun("second"); ran {
				t.Error("the second job ran its command")
			}
			if !tc.sameDir {
				code, rel := f.run(merge(github(1), map[string]string{"RUNNER_TEMP": secondDir}), "release", "--target", "staging", "--mine")
				if code != exitOK || !strings.Contains(rel.stderr.String(), "this job did not create it") {
					t.Errorf("the second job's release --mine exited %d; stderr:\n%s", code, rel.stderr)
				}
			}
			f.ranUntouched(first, "first", claim)
		})
	}
}

// TestAGitHubMatrixGivesEachJobARunIDOfItsOwn: with the variable the action
// passes (BUILDLOCK_JOB), two matrix jobs deploying one build to one target
// are two runs of it: the second is told that another run holds, not that
// they share an id, and its release leaves the first's claim.
func TestAGitHubMatrixGivesEachJobARunIDOfItsOwn(t *testing.T) {
	f := newFixture(t)
	job := func(index string) map[string]string {
		return merge(github(1), map[string]string{"GITHUB_JOB": "deploy", "BUILDLOCK_JOB": index, "RUNNER_TEMP": filepath.Join(f.dir, "runner-"+index)})
	}
	if code, p := f.run(job("0"), "acquire", "--target", "staging"); code != exitOK {
		t.Fatalf("the first matrix job exited %d; stderr:\n%s", code, p.stderr)
	}
	claim := f.get("acme-shop-main-42-staging")
	if lock.RunIDOf(claim) != "5005-1/deploy/0" {
		t.Errorf("the first job's run id is %q, want 5005-1/deploy/0", lock.RunIDOf(claim))
	}
	code, p := f.run(job("1"), "acquire", "--target", "staging")
	if code != exitOtherRun || !strings.Contains(p.stderr.String(), "belongs to another run of this build (run 5005-1/deploy/0, this is run 5005-1/deploy/1)") {
		t.Errorf("the second matrix job exited %d; stderr:\n%s", code, p.stderr)
	}
	if code, p := f.run(job("1"), "release", "--target", "staging", "--mine"); code != exitOK || f.get(claim.Name) == nil {
		t.Errorf("the second job's release --mine exited %d and took the first's claim; stderr:\n%s", code, p.stderr)
	}
	if code, p := f.run(job("0"), "release", "--target", "staging", "--mine"); code != exitOK || f.get(claim.Name) != nil {
		t.Errorf("the first job's release --mine exited %d and left its claim; stderr:\n%s", code, p.stderr)
	}
}

// jenkins is a stage of build 19 of the multibranch job acme/shop/main, on
// one agent's workspace.
func jenkins(f *fixture, stage string) map[string]string {
	return map[string]string{"JENKINS_URL": "https://ci.example.com/", "JOB_NAME": "acme/shop/main", "BRANCH_NAME": "main",
		"BUILD_NUMBER": "19", "BUILD_TAG": "jenkins-acme-shop-main-19", "STAGE_NAME": stage, "NODE_NAME": "agent-1",
		"WORKSPACE": filepath.Join(f.dir, "ws"), "WORKSPACE_TMP": filepath.Join(f.dir, "ws@tmp")}
}

// TestJenkinsParallelStagesNeverShareAClaim: parallel stages of one build
// share BUILD_TAG and, on one agent, the workspace. Acquiring as the
// shared-library step does (without a command, the body runs after it),
// another stage is another run of the build; and branches that even share
// the stage's name (a scripted parallel without stages) do not take the
// claim that the first handed over to its body.
func TestJenkinsParallelStagesNeverShareAClaim(t *testing.T) {
	f := newFixture(t)
	code, p := f.run(jenkins(f, "Deploy eu"), "acquire", "--target", "staging")
	if code != exitOK {
		t.Fatalf("stage eu exited %d; stderr:\n%s", code, p.stderr)
	}
	claim := f.get("acme-shop-main-19-staging")
	if run := lock.RunIDOf(claim); !strings.HasPrefix(run, "jenkins-acme-shop-main-19/Deploy eu/") {
		t.Errorf("stage eu's run id is %q, want the build tag and the stage", run)
	}
	code, p = f.run(jenkins(f, "Deploy us"), "acquire", "--target", "staging")
	if code != exitOtherRun || !strings.Contains(p.stderr.String(), "belongs to another run of this build") {
		t.Errorf("stage us exited %d; stderr:\n%s", code, p.stderr)
	}
	code, p = f.run(jenkins(f, "Deploy eu"), "acquire", "--target", "staging")
	if code != exitOtherRun || !strings.Contains(p.stderr.String(), "handed it over to the job's later steps") ||
		!strings.Contains(p.stderr.String(), "holds it with fencing token 1") {
		t.Errorf("a second branch of stage eu exited %d; stderr:\n%s", code, p.stderr)
	}
	if bl := f.get(claim.Name); bl == nil || bl.UID != claim.UID {
		t.Errorf("stage eu's claim changed: %+v", bl)
	}
	if code, p := f.run(jenkins(f, "Deploy eu"), "release", "--target", "staging", "--mine"); code != exitOK || f.get(claim.Name) != nil {
		t.Errorf("stage eu's release --mine exited %d and left its claim; stderr:\n%s", code, p.stderr)
	}
}

// TestTektonStepsOfATaskRunShareItsClaim: the Task's steps are containers of
// one pod, each with a /tmp of its own, and the Task passes the TaskRun's
// name (BUILDLOCK_JOB) and the pod's UID to each: the release step releases
// what the acquire step claimed; another TaskRun of the same name (a
// misconfigured Task) cannot.
func TestTektonStepsOfATaskRunShareItsClaim(t *testing.T) {
	f := newFixture(t)
	pod := func(name string) *corev1.Pod {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: name},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}},
		}
		must(t, admin.Create(context.Background(), p))
		return p
	}
	step := func(p *corev1.Pod, container string) map[string]string {
		return map[string]string{"REPO_OWNER": "acme", "REPO_NAME": "shop", "BRANCH_NAME": "main", "BUILD_NUMBER": "3",
			"KUBERNETES_SERVICE_HOST": "10.0.0.1", "HOSTNAME": p.Name, "POD_NAMESPACE": f.ns, "POD_UID": string(p.UID),
			"BUILDLOCK_JOB": "shop-run-7-deploy", "TMPDIR": filepath.Join(f.dir, p.Name, container)}
	}
	mine, other := pod("shop-run-7-deploy-pod"), pod("another-pod")
	if code, p := f.run(step(mine, "acquire"), "acquire", "--target", "staging"); code != exitOK {
		t.Fatalf("the acquire step exited %d; stderr:\n%s", code, p.stderr)
	}
	claim := f.get("acme-shop-main-3-staging")
	if lock.RunIDOf(claim) != "shop-run-7-deploy" || claim.Spec.PodRef == nil || claim.Spec.PodRef.UID != string(mine.UID) {
		t.Errorf("the claim is %+v, run %q; want the TaskRun's, on its pod", claim.Spec, lock.RunIDOf(claim))
	}
	code, p := f.run(step(other, "release"), "release", "--target", "staging", "--mine", "--repo", "acme/shop", "--branch", "main", "--build", "3")
	if code != exitOK || f.get(claim.Name) == nil {
		t.Errorf("another pod's release --mine exited %d and took the claim; stderr:\n%s", code, p.stderr)
	}
	code, p = f.run(step(mine, "release"), "release", "--target", "staging", "--mine", "--repo", "acme/shop", "--branch", "main", "--build", "3")
	if code != exitOK || f.get(claim.Name) != nil {
		t.Errorf("the release step exited %d and left the claim; stderr:\n%s", code, p.stderr)
	}
}

// TestAJobRetriedAfterThePluginDiedAttachesToItsClaim: the legitimate re-use
// of a claim: the same job's step, retried after its plugin was killed,
// finds its claim (which still holds: nobody released it) and deploys
// under the same hold.
func TestAJobRetriedAfterThePluginDiedAttachesToItsClaim(t *testing.T) {
	f := newFixture(t)
	job := merge(github(1), map[string]string{"RUNNER_TEMP": filepath.Join(f.dir, "runner")})
	env, cmd := f.helper("first", 5*time.Minute, 0)
	first := f.plugin(merge(job, env), append([]string{"acquire", "--target", "staging", "--expires-after", "1m"}, cmd...)...)
	f.started("first")
	claim := f.get("acme-shop-main-42-staging")
	must(t, first.cmd.Process.Kill())
	first.wait(t, time.Minute)
	pid := f.pidOf("first", ".pid")
	f.eventually(30*time.Second, "the killed plugin's command is gone", func() bool { return !alive(pid) })

	env, cmd = f.helper("retry", 0, 0)
	code, retry := f.run(merge(job, env), append([]string{"acquire", "--target", "staging", "--expires-after", "1m"}, cmd...)...)
	if code != exitOK || !strings.Contains(retry.stderr.String(), "Found this run's BuildLock "+f.ns+"/"+claim.Name) {
		t.Fatalf("the retry exited %d; stderr:\n%s", code, retry.stderr)
	}
	if run, ran := f.helperRun("retry"); !ran || run.token != "1" || run.name != claim.Name {
		t.Errorf("the retry's command ran %v with token %q on %q, want the same hold (token 1 on %s)", ran, run.token, run.name, claim.Name)
	}
}

// TestTheCommandDiesWithThePlugin kills the plugin with SIGKILL while its
// command (and the command's child, a deploy script's helm) runs, alone and
// with its process group, as a CI runner canceling a job does: both are
// gone, and the next build, waiting meanwhile, starts only after that,
// once the claim nobody renews has expired.
func TestTheCommandDiesWithThePlugin(t *testing.T) {
	for _, tc := range []struct {
		name string
		kill func(p *proc) error
	}{
		{"the plugin alone", func(p *proc) error { return p.cmd.Process.Signal(syscall.SIGKILL) }},
		{"the plugin's process group", func(p *proc) error { return syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			first, next := f.holdAndQueue(f.pluginInGroup, "HELPER_CHILD", "1")

			must(t, tc.kill(first))
			first.wait(t, time.Minute)
			pid, child := f.pidOf("first", ".pid"), f.pidOf("first", ".child")
			f.eventually(30*time.Second, "the command and its child are gone", func() bool { return !alive(pid) && !alive(child) })
			if run, ran := f.helperRun("next"); ran {
				t.Errorf("the next build started (at %d) while the killed plugin's command still ran", run.start)
			}
			if code := next.wait(t, time.Minute); code != exitOK {
				t.Fatalf("the next build exited %d; stderr:\n%s", code, next.stderr)
			}
			if bl := f.get("acme-shop-main-1-staging"); bl == nil || bl.Status.Phase != buildlockv1.PhaseExpired {
				t.Errorf("the killed plugin's claim is %+v, want it Expired", bl)
			}
		})
	}
}

// TestACommandThatEscapesIsBoundedByTheClaimsExpiry: what the command
// starts outside its process group (a daemon, setsid) outlives a killed
// plugin; the lock stays with the killed plugin's claim until it expires,
// expiresAfter after its last renewal, and only then goes to the next
// build.
func TestACommandThatEscapesIsBoundedByTheClaimsExpiry(t *testing.T) {
	f := newFixture(t)
	first, next := f.holdAndQueue(f.plugin, "HELPER_ESCAPE", "1")
	escaped := f.pidOf("first", ".escaped")
	t.Cleanup(func() {
		if pid, err := strconv.Atoi(escaped); err == nil {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	must(t, first.cmd.Process.Kill())
	first.wait(t, time.Minute)
	if code := next.wait(t, time.Minute); code != exitOK {
		t.Fatalf("the next build exited %d; stderr:\n%s", code, next.stderr)
	}
	killed := f.get("acme-shop-main-1-staging")
	run, _ := f.helperRun("next")
	if killed == nil || killed.Status.Phase != buildlockv1.PhaseExpired || killed.Status.FinishedAt == nil ||
		run.start < killed.Status.FinishedAt.UnixNano() {
		t.Errorf("the killed plugin's claim is %+v and the next build started at %d; want it Expired before", killed, run.start)
	}
	if !alive(escaped) {
		t.Error("the escaped process is gone: this test no longer shows what the claim's expiry bounds")
	}
}

// TestACommandIsStoppedWhenItsClaimCannotBeRenewed: a plugin that can no
// longer renew its pod-less claim (here its right to is revoked; a network
// partition does the same) stops its command, which ignores SIGTERM,
// before the claim can expire, and exits 5: the next build starts only
// once the command is gone.
func TestACommandIsStoppedWhenItsClaimCannotBeRenewed(t *testing.T) {
	f := newFixture(t)
	first, next := f.holdAndQueue(f.plugin, "HELPER_CHILD", "1", "HELPER_IGNORE_TERM", "1")

	f.revokePatch()
	pid, child := f.pidOf("first", ".pid"), f.pidOf("first", ".child")
	f.eventually(time.Minute, "the command and its child are gone", func() bool { return !alive(pid) && !alive(child) })
	if run, ran := f.helperRun("next"); ran {
		t.Errorf("the next build started (at %d) while the command still ran", run.start)
	}
	if code := first.wait(t, time.Minute); code != exitEnded || !strings.Contains(first.stderr.String(), "No renewal of the claim succeeded") {
		t.Errorf("the plugin exited %d, want %d saying that no renewal succeeded; stderr:\n%s", code, exitEnded, first.stderr)
	}
	if code := next.wait(t, time.Minute); code != exitOK {
		t.Errorf("the next build exited %d; stderr:\n%s", code, next.stderr)
	}
}

// holdAndQueue starts a build that deploys (helper "first", with extra)
// under a pod-less claim of 10s, with the plugin that start starts, and once
// its command runs, the next build, which waits for the lock.
func (f *fixture) holdAndQueue(start func(env map[string]string, args ...string) *proc, extra ...string) (first, next *proc) {
	f.t.Helper()
	env, cmd := f.helper("first", 5*time.Minute, 0, extra...)
	first = start(env, append([]string{"acquire", "--target", "staging", "--repo", "acme/shop", "--branch", "main", "--build", "1",
		"--expires-after", "10s", "--grace-period", "1s"}, cmd...)...)
	f.started("first")
	env, cmd = f.helper("next", 0, 0)
	next = f.plugin(env, append([]string{"acquire", "--target", "staging", "--repo", "acme/web", "--branch", "main", "--build", "1"}, cmd...)...)
	f.waitForPhase("acme-web-main-1-staging", buildlockv1.PhaseWaiting)
	return first, next
}

// revokePatch takes the pipeline user's right to patch (renew) BuildLocks
// in the fixture's namespace, and leaves it the rest.
func (f *fixture) revokePatch() {
	f.t.Helper()
	ctx := context.Background()
	must(f.t, admin.Create(ctx, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "no-patch"},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{buildlockv1.GroupVersion.Group}, Resources: []string{"buildlocks"}, Verbs: []string{"create", "delete", "get", "list", "watch"}},
			{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"get", "list", "watch"}},
		},
	}))
	must(f.t, admin.Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "no-patch"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "no-patch"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "User", Name: "ci-pipeline"}},
	}))
	must(f.t, admin.Delete(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "pipeline"}}))
}

// squatter is a client of another pipeline identity of the namespace, the
// service account "squatter", bound to the pipeline role.
func (f *fixture) squatter() client.Client {
	f.t.Helper()
	ctx := context.Background()
	must(f.t, admin.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "squatter"}}))
	must(f.t, admin.Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "squatter"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: pipelineRole},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: "squatter", Namespace: f.ns}},
	}))
	cfg := rest.CopyConfig(adminCfg)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + f.ns + ":squatter",
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + f.ns, "system:authenticated"}}
	c, err := lock.NewClient(cfg)
	must(f.t, err)
	return c
}

// derivedOnMain is the fallback name that the plugin derived, before this
// change, for a pod-less claim with -- CMD (expiresAfter 2m) of build of
// repo@branch on target: a hash of the claim's spec, which anyone could
// compute and take first.
func derivedOnMain(target, repo, branch string, build int64) string {
	h := sha256.New()
	for _, field := range []string{target, repo, branch, fmt.Sprint(build), "", "", time.Time{}.UTC().Format(time.RFC3339Nano), "2m0s"} {
		h.Write([]byte(field))
		h.Write([]byte{0})
	}
	return fmt.Sprintf("%s-%d-%s-%s", strings.ReplaceAll(strings.ReplaceAll(repo, "/", "-"), "_", "-")+"-"+branch, build, target, hex.EncodeToString(h.Sum(nil))[:8])
}

// TestANameTakenByAnotherIdentityDoesNotStopTheBuild: another pipeline
// identity of the namespace creates claims under every name this build
// could derive (another build's, and another identity's claim of this very
// build); the build claims under a name nobody could predict and is not
// refused for it.
func TestANameTakenByAnotherIdentityDoesNotStopTheBuild(t *testing.T) {
	t.Run("another build under its names", func(t *testing.T) {
		f := newFixture(t)
		squatter := f.squatter()
		for i, name := range []string{"acme-shop-main-42-staging", derivedOnMain("staging", "acme/shop", "main", 42)} {
			bl := lock.Claim{Namespace: f.ns, Target: "elsewhere", Repo: "evil/thing", Branch: "main", Build: int64(i + 1)}.BuildLock()
			bl.Name = name
			must(t, squatter.Create(context.Background(), bl))
		}

		env, cmd := f.helper("victim", 0, 0)
		code, p := f.run(merge(github(1), env), append([]string{"acquire", "--target", "staging", "--timeout", "1m"}, cmd...)...)
		if code != exitOK {
			t.Fatalf("the build exited %d; stderr:\n%s", code, p.stderr)
		}
		run, ran := f.helperRun("victim")
		if !ran || !strings.HasPrefix(run.name, "acme-shop-main-42-staging-") || run.name == derivedOnMain("staging", "acme/shop", "main", 42) {
			t.Errorf("the build's command ran %v under %q, want a fallback name of its own", ran, run.name)
		}
		if !strings.Contains(p.stderr.String(), "is not this job's (build 1 of evil/thing@main on elsewhere, created by system:serviceaccount:"+f.ns+":squatter)") {
			t.Errorf("stderr does not say whose claim took the name:\n%s", p.stderr)
		}
	})
	t.Run("another identity's claim of this build", func(t *testing.T) {
		f := newFixture(t)
		squatter := f.squatter()
		bl := lock.Claim{Namespace: f.ns, Target: "staging", Repo: "acme/shop", Branch: "main", Build: 42, RunID: "5005-1"}.BuildLock()
		must(t, squatter.Create(context.Background(), bl))
		code, p := f.run(github(1), "acquire", "--target", "staging", "--timeout", "30s")
		if code == exitOtherRun || !strings.Contains(p.stderr.String(), "claiming under another name") {
			t.Errorf("the build exited %d, taking another identity's claim for another run of it; stderr:\n%s", code, p.stderr)
		}
	})
}

// TestOutsideCIARetryIsTheSameRun: by hand, without CI variables, the run
// is this user's on this machine: acquiring again after the plugin was
// killed attaches to the claim; acquiring again while the first still
// runs is refused, as for two jobs.
func TestOutsideCIARetryIsTheSameRun(t *testing.T) {
	f := newFixture(t)
	args := []string{"acquire", "--target", "staging", "--repo", "acme/shop", "--branch", "main", "--build", "7", "--expires-after", "1m"}
	env, cmd := f.helper("first", 5*time.Minute, 0)
	first := f.plugin(env, append(args, cmd...)...)
	f.started("first")
	host, _ := os.Hostname()
	claim := f.get("acme-shop-main-7-staging")
	if want := lock.LocalRunID("ci", host); lock.RunIDOf(claim) != want {
		t.Errorf("the run id is %q, want %q", lock.RunIDOf(claim), want)
	}
	env, cmd = f.helper("concurrent", 0, 0)
	if code, p := f.run(env, append(args, cmd...)...); code != exitOtherRun || !strings.Contains(p.stderr.String(), "Another acquire of this run") {
		t.Errorf("a concurrent acquire exited %d, want %d; stderr:\n%s", code, exitOtherRun, p.stderr)
	}

	must(t, first.cmd.Process.Kill())
	first.wait(t, time.Minute)
	env, cmd = f.helper("retry", 0, 0)
	code, p := f.run(env, append(args, cmd...)...)
	if code != exitOK || !strings.Contains(p.stderr.String(), "Found this run's BuildLock") {
		t.Fatalf("the retry exited %d, want 0 on its own claim; stderr:\n%s", code, p.stderr)
	}
	if run, _ := f.helperRun("retry"); run.token != "1" || run.name != claim.Name {
		t.Errorf("the retry ran with token %q on %q, want token 1 on %s", run.token, run.name, claim.Name)
	}
}
