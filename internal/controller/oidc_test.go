package controller_test

import (
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
	"github.com/buildlock/buildlock/internal/testenv"
)

// The audience and organization that examples/github-actions/authentication.yaml
// and examples/gitlab/authentication.yaml trust.
const (
	oidcAudience   = "https://k8s.acme.example"
	acmeGitHubID   = "81563142"
	acmeGitLabPath = "acme"
)

// ciJob is a CI job whose OIDC token reaches the API server: a GitHub
// Actions workflow run's, or a GitLab job's.
type ciJob struct {
	// issuer is the suite's issuer that signs the token (the variable: the
	// suite starts the issuers after the specs are built).
	issuer **testenv.OIDCIssuer
	claims map[string]any
}

// githubJob is a run of a workflow of repository owner/name, with the
// claims GitHub Actions puts into its ID token (docs.github.com, "OpenID
// Connect reference").
func githubJob(repository, runID, attempt string) ciJob {
	owner, _, _ := strings.Cut(repository, "/")
	return ciJob{issuer: &githubIssuer, claims: map[string]any{
		"sub":                   "repo:" + repository + ":ref:refs/heads/main",
		"aud":                   oidcAudience,
		"ref":                   "refs/heads/main",
		"ref_type":              "branch",
		"sha":                   "e4f2c1b0a9d8c7b6a5f4e3d2c1b0a9d8c7b6a5f4",
		"repository":            repository,
		"repository_id":         "690112342",
		"repository_owner":      owner,
		"repository_owner_id":   acmeGitHubID,
		"repository_visibility": "private",
		"actor":                 "octocat",
		"actor_id":              "583231",
		"workflow":              "deploy",
		"workflow_ref":          repository + "/.github/workflows/deploy.yaml@refs/heads/main",
		"job_workflow_ref":      repository + "/.github/workflows/deploy.yaml@refs/heads/main",
		"event_name":            "push",
		"run_id":                runID,
		"run_number":            "42",
		"run_attempt":           attempt,
		"runner_environment":    "github-hosted",
	}}
}

// gitlabJob is a job of project group/.../name, with the claims GitLab puts
// into an id_tokens entry (docs.gitlab.com, "OpenID Connect (OIDC)
// Authentication Using ID Tokens").
func gitlabJob(project, jobID string) ciJob {
	namespace := project[:strings.LastIndex(project, "/")]
	return ciJob{issuer: &gitlabIssuer, claims: map[string]any{
		"sub":                   "project_path:" + project + ":ref_type:branch:ref:main",
		"aud":                   oidcAudience,
		"namespace_id":          "72",
		"namespace_path":        namespace,
		"project_id":            "20",
		"project_path":          project,
		"user_id":               "1",
		"user_login":            "alice",
		"pipeline_id":           "1212",
		"pipeline_source":       "push",
		"job_id":                jobID,
		"ref":                   "main",
		"ref_type":              "branch",
		"ref_path":              "refs/heads/main",
		"ref_protected":         "true",
		"runner_id":             "1",
		"runner_environment":    "gitlab-hosted",
		"sha":                   "e4f2c1b0a9d8c7b6a5f4e3d2c1b0a9d8c7b6a5f4",
		"project_visibility":    "private",
		"ci_config_ref_uri":     "gitlab.com/" + project + "//.gitlab-ci.yml@refs/heads/main",
		"deployment_tier":       "staging",
		"environment":           "staging",
		"environment_protected": "false",
	}}
}

// with returns the job with claims changed (nil removes one).
func (j ciJob) with(claims map[string]any) ciJob {
	all := map[string]any{}
	for k, v := range j.claims {
		all[k] = v
	}
	for k, v := range claims {
		if v == nil {
			delete(all, k)
			continue
		}
		all[k] = v
	}
	return ciJob{issuer: j.issuer, claims: all}
}

// config is a connection to the suite's API server with the job's ID token
// as bearer token, as the job's kubeconfig would have it: no client
// certificate, no impersonation.
func (j ciJob) config() *rest.Config {
	GinkgoHelper()
	token, err := (*j.issuer).Token(j.claims)
	Expect(err).NotTo(HaveOccurred())
	return &rest.Config{Host: cfg.Host, TLSClientConfig: rest.TLSClientConfig{CAData: cfg.CAData}, BearerToken: token}
}

func (j ciJob) client() client.Client {
	GinkgoHelper()
	cl, err := client.New(j.config(), client.Options{Scheme: scheme})
	Expect(err).NotTo(HaveOccurred())
	return cl
}

// whoami is what the API server authenticated the job as.
func (j ciJob) whoami() (authenticationv1.UserInfo, error) {
	cs, err := kubernetes.NewForConfig(j.config())
	if err != nil {
		return authenticationv1.UserInfo{}, err
	}
	r, err := cs.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		return authenticationv1.UserInfo{}, err
	}
	return r.Status.UserInfo, nil
}

// grantAllToGroup gives the members of group every right in namespace ns.
func grantAllToGroup(ns, group string) {
	GinkgoHelper()
	grantAllTo(ns, rbacv1.Subject{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: group})
}

// Issue 25: hosted runners reach the cluster with their CI job's OIDC token,
// which the API server trusts as examples/*/authentication.yaml configure
// it; the token's repository is a verified identity, and a pipeline's.
var _ = Describe("CI identities from OIDC tokens", Ordered, func() {
	var (
		ci, target string
		shop       = githubJob("acme/shop", "5005", "1")
		web        = githubJob("acme/web", "6006", "1")
		api        = gitlabJob("acme/platform/api", "9001")
	)

	BeforeAll(func() {
		ci = newNamespace()
		target = "oidc-" + ci[len("bl-"):]
		namespaceNamed(target, map[string]string{buildlockv1.LockedByLabel: ci})
		for _, ns := range []string{ci, target} {
			grantAllToGroup(ns, "github:acme")
			grantAllToGroup(ns, "gitlab:acme/platform")
		}
		grantAll(target, "alice")
		// A claim counts as the requester policy's word 30 s after the
		// policy (RequesterSettle, shortened here), and only from the
		// second after it was created.
		var policy admissionv1.MutatingAdmissionPolicy
		Expect(k8sClient.Get(ctx, types.NamespacedName{Name: "buildlock-requester"}, &policy)).To(Succeed())
		time.Sleep(time.Until(policy.CreationTimestamp.Add(2 * time.Second)))
		startScopedManager(testenv.ManagerOptions{RequesterSettle: time.Nanosecond}, ci)
	})

	It("authenticates a GitHub workflow's token as its repository, with its run and claims in the extra", func() {
		user, err := shop.whoami()
		Expect(err).NotTo(HaveOccurred())
		Expect(user.Username).To(Equal("github:acme/shop"))
		Expect(user.Groups).To(ContainElements("github:acme", "system:authenticated"))
		Expect(user.Extra).To(HaveKeyWithValue(buildlockv1.RepositoryExtra, authenticationv1.ExtraValue{"acme/shop"}))
		Expect(user.Extra).To(HaveKeyWithValue(buildlockv1.RunExtra, authenticationv1.ExtraValue{"5005/1"}))
		Expect(user.Extra).To(HaveKeyWithValue("github.com/ref", authenticationv1.ExtraValue{"refs/heads/main"}))
	})

	It("authenticates a GitLab job's token as its project", func() {
		user, err := api.whoami()
		Expect(err).NotTo(HaveOccurred())
		Expect(user.Username).To(Equal("gitlab:acme/platform/api"))
		Expect(user.Groups).To(ContainElement("gitlab:acme/platform"))
		Expect(user.Extra).To(HaveKeyWithValue(buildlockv1.RepositoryExtra, authenticationv1.ExtraValue{"acme/platform/api"}))
		Expect(user.Extra).To(HaveKeyWithValue(buildlockv1.RunExtra, authenticationv1.ExtraValue{"9001"}))
	})

	It("refuses tokens of another organization, for another audience, or from another issuer's key", func() {
		for what, job := range map[string]ciJob{
			"GitHub, another organization":  githubJob("evil/shop", "1", "1").with(map[string]any{"repository_owner_id": "666"}),
			"GitHub, another audience":      shop.with(map[string]any{"aud": "https://github.com/acme"}),
			"GitLab, another group":         gitlabJob("evil/api", "1"),
			"GitLab, expired":               api.with(map[string]any{"exp": time.Now().Add(-time.Minute).Unix()}),
			"GitLab's key, GitHub's issuer": {issuer: &gitlabIssuer, claims: shop.with(map[string]any{"iss": "https://token.actions.githubusercontent.com"}).claims},
		} {
			_, err := job.whoami()
			Expect(apierrors.IsUnauthorized(err)).To(BeTrue(), "%s: %v", what, err)
		}
	})

	It("stamps a claim with the CI identity's repository and run", func() {
		Expect(shop.client().Create(ctx, newClaim(ci, "shop-42", claimOpts{target: target, repo: "acme/shop", build: 42}))).To(Succeed())
		bl := expectPhase(ci, "shop-42", buildlockv1.PhaseHeld)
		Expect(bl.Spec.Requester).To(Equal(&buildlockv1.Requester{Username: "github:acme/shop", Repository: "acme/shop", Run: "5005/1",
			Workflow: "acme/shop/.github/workflows/deploy.yaml"}))
		Expect(bl.Spec.Workflow).To(Equal("acme/shop/.github/workflows/deploy.yaml"), "the token's workflow, as the claim named none")
	})

	It("lets a CI identity claim for its token's workflow only (issue 31)", func() {
		// (Another target: this Describe's specs share the target's lock.)
		bl := newClaim(ci, "shop-43-x", claimOpts{target: "workflows", repo: "acme/shop", build: 43})
		bl.Spec.Workflow = "x"
		Expect(shop.client().Create(ctx, bl)).To(beRefusedWith("spec.workflow must be acme/shop/.github/workflows/deploy.yaml, not x",
			"names workflow acme/shop/.github/workflows/deploy.yaml"))
		bl.Spec.Workflow = "acme/shop/.github/workflows/deploy.yaml"
		Expect(shop.client().Create(ctx, bl)).To(Succeed())
		Expect(shop.client().Delete(ctx, bl)).To(Succeed())
	})

	It("refuses a claim for another repository than the token's, and says what to fix", func() {
		err := shop.client().Create(ctx, newClaim(ci, "web-as-shop", claimOpts{target: target, repo: "acme/web", build: 7}))
		Expect(err).To(beRefusedWith("spec.repo must be acme/shop, not acme/web", "github:acme/shop is the CI identity of repository acme/shop"))
		err = api.client().Create(ctx, newClaim(ci, "shop-as-api", claimOpts{target: target, repo: "acme/shop", build: 7}))
		Expect(err).To(beRefusedWith("spec.repo must be acme/platform/api, not acme/shop"))
	})

	It("refuses a CI identity's claim that names a pod", func() {
		pod := createPod(ci, "long-running")
		bl := newClaim(ci, "shop-on-a-pod", claimOpts{target: "elsewhere", repo: "acme/shop", build: 43})
		bl.Spec.PodRef = &buildlockv1.PodReference{Name: pod.Name, UID: string(pod.UID)}
		Expect(shop.client().Create(ctx, bl)).To(beRefusedWith("spec.podRef must be empty: github:acme/shop is a CI identity"))
	})

	Context("with the target enforced", Ordered, func() {
		BeforeAll(func() {
			policy := &buildlockv1.BuildLockPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ci, Name: target}}
			policy.Spec.Enforce = &buildlockv1.Enforcement{ServiceAccounts: []string{"pipeline"}}
			Expect(k8sClient.Create(ctx, policy)).To(Succeed())
			Eventually(func(g Gomega) {
				var p buildlockv1.BuildLockPolicy
				g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(policy), &p)).To(Succeed())
				g.Expect(p.Status.Conditions).To(ContainElement(HaveField("Reason", buildlockv1.ReasonEnforcing)))
			}).Should(Succeed())
		})

		It("admits the holder's run and refuses another repository's, another run's and another CI system's", func() {
			Eventually(func() error { return deployAs(shop, target, "from-holder") }).Should(Succeed())
			Expect(deployAs(web, target, "from-web")).To(beRefusedWith("held by BuildLock "+ci+"/shop-42", "kubectl buildlock acquire"))
			Expect(deployAs(githubJob("acme/shop", "5006", "1"), target, "from-another-run")).To(beRefusedWith("held by BuildLock " + ci + "/shop-42"))
			Expect(deployAs(shop.with(map[string]any{"run_attempt": "2"}), target, "from-a-rerun")).To(beRefusedWith("held by BuildLock"))
			Expect(deployAs(api, target, "from-gitlab")).To(beRefusedWith("held by BuildLock"))
			Expect(deploy(identity{user: "alice"}, target, "from-alice")).To(Succeed())
		})

		It("lets a CI identity change only the claims of its own run, and never force-release", func() {
			Expect(web.client().Create(ctx, newClaim(ci, "web-7", claimOpts{target: target, repo: "acme/web", build: 7}))).To(Succeed())
			expectPhase(ci, "web-7", buildlockv1.PhaseWaiting)
			Expect(web.client().Delete(ctx, getClaim(Default, ci, "shop-42"))).To(beRefusedWith("was created by github:acme/shop"))
			Expect(githubJob("acme/shop", "5006", "1").client().Delete(ctx, getClaim(Default, ci, "shop-42"))).
				To(beRefusedWith("a pipeline may change or delete only the BuildLocks it created"))
			release := mergePatch(map[string]any{"metadata": map[string]any{"annotations": map[string]string{
				buildlockv1.ForceReleaseAnnotation: "web: my turn",
			}}})
			Expect(web.client().Patch(ctx, getClaim(Default, ci, "web-7"), release)).To(beRefusedWith("Force-release is for people"))
		})

		It("never lets a CI identity give or withdraw a namespace's consent", func() {
			ns := &corev1.Namespace{}
			Expect(k8sClient.Get(ctx, types.NamespacedName{Name: target}, ns)).To(Succeed())
			unlabel := mergePatch(map[string]any{"metadata": map[string]any{"labels": map[string]any{buildlockv1.LockedByLabel: nil}}})
			Expect(shop.client().Patch(ctx, ns, unlabel)).To(beRefusedWith("only people give or withdraw a namespace's consent"))
		})

		It("hands the target to the next run, whose writes it then admits", func() {
			Expect(shop.client().Delete(ctx, getClaim(Default, ci, "shop-42"))).To(Succeed())
			expectPhase(ci, "web-7", buildlockv1.PhaseHeld)
			Eventually(func() error { return deployAs(web, target, "from-web-holding") }).Should(Succeed())
			Expect(deployAs(shop, target, "from-the-last-holder")).To(beRefusedWith("held by BuildLock " + ci + "/web-7"))
			Expect(getLease(Default, ci, target).Annotations).To(HaveKeyWithValue("buildlock.io/writer-run", "6006/1"))
		})

		It("fences the CI identities of the repositories the policy names only", func() {
			var p buildlockv1.BuildLockPolicy
			Expect(k8sClient.Get(ctx, types.NamespacedName{Namespace: ci, Name: target}, &p)).To(Succeed())
			p.Spec.Enforce.Repositories = []string{"acme/shop", "acme/web"}
			Expect(k8sClient.Update(ctx, &p)).To(Succeed())
			Eventually(func() error { return deployAs(api, target, "from-gitlab-unfenced") }).Should(Succeed())
			Expect(deployAs(shop, target, "from-shop-fenced")).To(beRefusedWith("held by BuildLock " + ci + "/web-7"))
		})
	})

	It("binds a line to the CI identity that held it", func() {
		// The records of the lines acme/shop@main and acme/web@main name
		// their CI identities; a service account's claim of one is refused.
		Expect(getLease(Default, ci, target).Annotations["buildlock.io/lines"]).
			To(ContainSubstring(`"owner":"github:acme/shop","ownerCI":true`))
		sa := identity{user: "system:serviceaccount:" + ci + ":pipeline"}
		grantAll(ci, sa.user)
		Expect(sa.client().Create(ctx, newClaim(ci, "shop-as-sa", claimOpts{target: target, repo: "acme/shop", build: 50}))).To(Succeed())
		bl := expectPhase(ci, "shop-as-sa", buildlockv1.PhaseSuperseded)
		Expect(bl.Status.Reason).To(Equal(buildlockv1.ReasonLineOwnedByOther))
		Expect(bl.Status.Message).To(ContainSubstring("its branch acme/shop@main belongs to github:acme/shop"))
	})
})

// deployAs writes a ConfigMap into ns as the CI job: what its deploy does.
func deployAs(j ciJob, ns, name string) error {
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	return j.client().Create(ctx, cm)
}
