package lock

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"
)

func TestDetectCI(t *testing.T) {
	tests := map[string]struct {
		env  map[string]string
		want CI
	}{
		"no CI variables give nothing": {
			env:  map[string]string{"HOME": "/root", "HOSTNAME": "laptop"},
			want: CI{},
		},
		"GitHub Actions": {
			env: map[string]string{"GITHUB_ACTIONS": "true", "GITHUB_REPOSITORY": "acme/shop",
				"GITHUB_REF_NAME": "main", "GITHUB_RUN_NUMBER": "42", "GITHUB_RUN_ATTEMPT": "2"},
			want: CI{System: CIGitHubActions, Repo: "acme/shop", Branch: "main", Build: 42},
		},
		"a GitHub run is its run id and attempt": {
			env: map[string]string{"GITHUB_ACTIONS": "true", "GITHUB_REPOSITORY": "acme/shop", "GITHUB_REF_NAME": "main",
				"GITHUB_RUN_NUMBER": "42", "GITHUB_RUN_ID": "9876543210", "GITHUB_RUN_ATTEMPT": "2"},
			want: CI{System: CIGitHubActions, Repo: "acme/shop", Branch: "main", Build: 42, RunID: "9876543210-2"},
		},
		"a GitHub job is its run, its job id and the matrix entry the action passes": {
			env: map[string]string{"GITHUB_ACTIONS": "true", "GITHUB_REPOSITORY": "acme/shop", "GITHUB_REF_NAME": "main",
				"GITHUB_RUN_NUMBER": "42", "GITHUB_RUN_ID": "9876543210", "GITHUB_RUN_ATTEMPT": "2", "GITHUB_JOB": "deploy",
				"BUILDLOCK_JOB": "51725241954", "RUNNER_TEMP": "/home/runner/work/_temp"},
			want: CI{System: CIGitHubActions, Repo: "acme/shop", Branch: "main", Build: 42, RunID: "9876543210-2/deploy/51725241954",
				StateDir: "/home/runner/work/_temp"},
		},
		"a GitHub run without its attempt is the first": {
			env:  map[string]string{"GITHUB_REPOSITORY": "acme/shop", "GITHUB_REF_NAME": "main", "GITHUB_RUN_NUMBER": "42", "GITHUB_RUN_ID": "987"},
			want: CI{System: CIGitHubActions, Repo: "acme/shop", Branch: "main", Build: 42, RunID: "987-1"},
		},
		"a GitHub workflow is GITHUB_WORKFLOW_REF without its ref: run numbers count per workflow": {
			env: map[string]string{"GITHUB_ACTIONS": "true", "GITHUB_REPOSITORY": "acme/shop", "GITHUB_REF_NAME": "main", "GITHUB_RUN_NUMBER": "12",
				"GITHUB_WORKFLOW_REF": "acme/shop/.github/workflows/hotfix.yml@refs/heads/main"},
			want: CI{System: CIGitHubActions, Repo: "acme/shop", Branch: "main", Build: 12, Workflow: "acme/shop/.github/workflows/hotfix.yml"},
		},
		"BUILDLOCK_WORKFLOW is the workflow, whatever the CI system": {
			env: map[string]string{"REPO_OWNER": "acme", "REPO_NAME": "shop", "BRANCH_NAME": "main", "BUILD_NUMBER": "3",
				"BUILDLOCK_WORKFLOW": "shop-release", "BUILDLOCK_JOB": "shop-run-7-deploy"},
			want: CI{System: CITekton, Repo: "acme/shop", Branch: "main", Build: 3, Workflow: "shop-release", RunID: "shop-run-7-deploy"},
		},
		"a workflow with control characters is replaced by a hash of it": {
			env:  map[string]string{"GITLAB_CI": "true", "CI_PROJECT_PATH": "acme/shop", "CI_PIPELINE_IID": "3", "BUILDLOCK_WORKFLOW": "a\x1b[2Jb"},
			want: CI{System: CIGitLab, Repo: "acme/shop", Build: 3, Workflow: identityHash("a\x1b[2Jb")},
		},
		"a GitLab run is its job": {
			env: map[string]string{"GITLAB_CI": "true", "CI_PROJECT_PATH": "acme/shop", "CI_COMMIT_REF_NAME": "main",
				"CI_PIPELINE_IID": "311", "CI_JOB_ID": "4455"},
			want: CI{System: CIGitLab, Repo: "acme/shop", Branch: "main", Build: 311, RunID: "4455"},
		},
		"a Jenkins run is its build tag": {
			env: map[string]string{"JENKINS_URL": "https://ci.example.com/", "JOB_NAME": "acme/shop/main", "BRANCH_NAME": "main",
				"BUILD_NUMBER": "19", "BUILD_TAG": "jenkins-acme-shop-main-19"},
			want: CI{System: CIJenkins, Repo: "acme/shop", Branch: "main", Build: 19, Workflow: "acme/shop", RunID: "jenkins-acme-shop-main-19"},
		},
		"a Jenkins stage is its build tag, its stage and its node's workspace": {
			env: map[string]string{"JENKINS_URL": "https://ci.example.com/", "JOB_NAME": "acme/shop/main", "BRANCH_NAME": "main",
				"BUILD_NUMBER": "19", "BUILD_TAG": "jenkins-acme-shop-main-19", "STAGE_NAME": "Deploy to staging",
				"NODE_NAME": "agent-1", "WORKSPACE": "/ws/acme_shop_main@2", "WORKSPACE_TMP": "/ws/acme_shop_main@2@tmp"},
			want: CI{System: CIJenkins, Repo: "acme/shop", Branch: "main", Build: 19, Workflow: "acme/shop",
				RunID:    "jenkins-acme-shop-main-19/Deploy to staging/" + identityHash("agent-1", "/ws/acme_shop_main@2"),
				StateDir: "/ws/acme_shop_main@2@tmp"},
		},
		"a Tekton run is the TaskRun the Task passes": {
			env: map[string]string{"REPO_OWNER": "acme", "REPO_NAME": "shop", "BRANCH_NAME": "main", "BUILD_NUMBER": "3",
				"KUBERNETES_SERVICE_HOST": "10.0.0.1", "HOSTNAME": "deploy-pod", "POD_UID": "6f1c7a2e-0000-4000-8000-000000000001",
				"BUILDLOCK_JOB": "shop-run-7-deploy"},
			want: CI{System: CITekton, Repo: "acme/shop", Branch: "main", Build: 3, Pod: "deploy-pod",
				PodUID: "6f1c7a2e-0000-4000-8000-000000000001", RunID: "shop-run-7-deploy"},
		},
		"BUILDLOCK_RUN_ID is the whole run id, and BUILDLOCK_STATE_DIR the state directory": {
			env: map[string]string{"GITLAB_CI": "true", "CI_PROJECT_PATH": "acme/shop", "CI_COMMIT_REF_NAME": "main",
				"CI_PIPELINE_IID": "311", "CI_JOB_ID": "4455", "BUILDLOCK_JOB": "x", "BUILDLOCK_RUN_ID": "mine",
				"BUILDLOCK_STATE_DIR": "/state", "RUNNER_TEMP": "/other"},
			want: CI{System: CIGitLab, Repo: "acme/shop", Branch: "main", Build: 311, RunID: "mine", StateDir: "/state"},
		},
		"a long build tag is shortened with a hash": {
			env:  map[string]string{"JENKINS_URL": "x", "JOB_NAME": "a/b", "BUILD_NUMBER": "1", "BUILD_TAG": strings.Repeat("t", 200)},
			want: CI{System: CIJenkins, Repo: "a/b", Build: 1, Workflow: "a/b", RunID: strings.Repeat("t", 119) + "-" + identityHash(strings.Repeat("t", 200))},
		},
		"a Tekton run is its pod's UID": {
			env: map[string]string{"REPO_OWNER": "acme", "REPO_NAME": "shop", "BRANCH_NAME": "main", "BUILD_NUMBER": "3",
				"KUBERNETES_SERVICE_HOST": "10.0.0.1", "HOSTNAME": "deploy-pod", "POD_UID": "6f1c7a2e-0000-4000-8000-000000000001"},
			want: CI{System: CITekton, Repo: "acme/shop", Branch: "main", Build: 3, Pod: "deploy-pod",
				PodUID: "6f1c7a2e-0000-4000-8000-000000000001", RunID: "6f1c7a2e-0000-4000-8000-000000000001"},
		},
		"GitHub Actions on a self-hosted runner pod names the pod": {
			env: map[string]string{"GITHUB_ACTIONS": "true", "GITHUB_REPOSITORY": "acme/shop", "GITHUB_REF_NAME": "main",
				"GITHUB_RUN_NUMBER": "7", "KUBERNETES_SERVICE_HOST": "10.0.0.1", "HOSTNAME": "runner-abc12"},
			want: CI{System: CIGitHubActions, Repo: "acme/shop", Branch: "main", Build: 7, Pod: "runner-abc12"},
		},
		"GitLab CI with a nested group": {
			env: map[string]string{"GITLAB_CI": "true", "CI_PROJECT_PATH": "acme/web/shop",
				"CI_COMMIT_REF_NAME": "feature/cart", "CI_PIPELINE_IID": "311", "CI_PIPELINE_ID": "987654"},
			want: CI{System: CIGitLab, Repo: "acme/web/shop", Branch: "feature/cart", Build: 311},
		},
		"Tekton or Jenkins X in a pod": {
			env: map[string]string{"REPO_OWNER": "acme", "REPO_NAME": "shop", "BRANCH_NAME": "PR-12",
				"BUILD_NUMBER": "3", "KUBERNETES_SERVICE_HOST": "10.0.0.1", "HOSTNAME": "shop-pr-12-3-deploy-pod"},
			want: CI{System: CITekton, Repo: "acme/shop", Branch: "PR-12", Build: 3, Pod: "shop-pr-12-3-deploy-pod", RunID: "shop-pr-12-3-deploy-pod"},
		},
		"a Jenkins multibranch job drops its branch segment": {
			env: map[string]string{"JENKINS_URL": "https://ci.example.com/", "JOB_NAME": "acme/shop/feature%2Fcart",
				"BRANCH_NAME": "feature/cart", "BUILD_NUMBER": "19"},
			want: CI{System: CIJenkins, Repo: "acme/shop", Branch: "feature/cart", Build: 19, Workflow: "acme/shop"},
		},
		"a plain Jenkins job takes its branch from GIT_BRANCH": {
			env:  map[string]string{"JENKINS_URL": "https://ci.example.com/", "JOB_NAME": "Deploy Shop", "GIT_BRANCH": "origin/main", "BUILD_NUMBER": "5"},
			want: CI{System: CIJenkins, Repo: "jenkins/Deploy-Shop", Branch: "main", Build: 5, Workflow: "Deploy Shop"},
		},
		"GitHub wins over variables that a Jenkins agent left": {
			env: map[string]string{"GITHUB_REPOSITORY": "acme/shop", "GITHUB_REF_NAME": "main", "GITHUB_RUN_NUMBER": "1",
				"JOB_NAME": "x", "BUILD_NUMBER": "99"},
			want: CI{System: CIGitHubActions, Repo: "acme/shop", Branch: "main", Build: 1},
		},
		"a build number that is not one is left out": {
			env:  map[string]string{"GITLAB_CI": "true", "CI_PROJECT_PATH": "a/b", "CI_COMMIT_REF_NAME": "main", "CI_PIPELINE_IID": "abc"},
			want: CI{System: CIGitLab, Repo: "a/b", Branch: "main"},
		},
		"a step that passes the build as flags is its job, else its pod": {
			env:  map[string]string{"KUBERNETES_SERVICE_HOST": "10.0.0.1", "HOSTNAME": "run-7-deploy-pod", "BUILDLOCK_JOB": "run-7-deploy"},
			want: CI{Pod: "run-7-deploy-pod", RunID: "run-7-deploy"},
		},
		"a pod without CI variables is its own run": {
			env:  map[string]string{"KUBERNETES_SERVICE_HOST": "10.0.0.1", "HOSTNAME": "debug-pod"},
			want: CI{Pod: "debug-pod", RunID: "debug-pod"},
		},
		"HOSTNAME outside a pod is not a pod": {
			env:  map[string]string{"HOSTNAME": "runner-1"},
			want: CI{},
		},
		"a HOSTNAME that is no pod name is ignored": {
			env:  map[string]string{"KUBERNETES_SERVICE_HOST": "10.0.0.1", "HOSTNAME": "My_Laptop"},
			want: CI{},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := DetectCI(tc.env); got != tc.want {
				t.Errorf("DetectCI() = %+v, want %+v", got, tc.want)
			}
		})
	}
}

// FuzzDetectCI feeds arbitrary values to the variables DetectCI reads and
// checks that what it returns is usable: no panic, builds are positive or
// zero, a pod is a pod name, and a repo derived from a Jenkins job name is
// one the API accepts.
func FuzzDetectCI(f *testing.F) {
	f.Add("GITHUB_REPOSITORY", "acme/shop", "main", "42", "runner-0")
	f.Add("CI_PROJECT_PATH", "group/sub/name", "feature/x", "311", "")
	f.Add("REPO_OWNER", "acme", "PR-1", "3", "pod-1")
	f.Add("JOB_NAME", "folder/repo/feature%2Fx", "feature/x", "19", "")
	f.Add("JOB_NAME", "%zz/%2F/ /", "", "-1", "Bad_Host")
	f.Fuzz(func(t *testing.T, marker, value, branch, build, host string) {
		env := map[string]string{
			marker: value, "REPO_NAME": value, "JENKINS_URL": "x",
			"GITHUB_REF_NAME": branch, "CI_COMMIT_REF_NAME": branch, "BRANCH_NAME": branch,
			"GITHUB_RUN_NUMBER": build, "CI_PIPELINE_IID": build, "BUILD_NUMBER": build,
			"KUBERNETES_SERVICE_HOST": "10.0.0.1", "HOSTNAME": host,
			"GITHUB_RUN_ID": value, "CI_JOB_ID": value, "BUILD_TAG": value, "POD_UID": value,
			"GITHUB_JOB": branch, "STAGE_NAME": branch, "WORKSPACE": value, "BUILDLOCK_JOB": host,
		}
		ci := DetectCI(env)
		if ci.Build < 0 {
			t.Errorf("negative build %d", ci.Build)
		}
		if ci.Pod != "" && len(validation.IsDNS1123Subdomain(ci.Pod)) > 0 {
			t.Errorf("pod %q is not a pod name", ci.Pod)
		}
		if err := validateRunID(ci.RunID); err != nil {
			t.Error(err)
		}
		if ci.PodUID != "" && !podUIDPattern.MatchString(ci.PodUID) {
			t.Errorf("pod UID %q is not a UID", ci.PodUID)
		}
		if ci.System == CIJenkins && ci.Repo != "" && !repoPattern.MatchString(ci.Repo) {
			t.Errorf("Jenkins repo %q from JOB_NAME %q is not owner/name", ci.Repo, env["JOB_NAME"])
		}
		if ci.System == "" && (ci.Repo != "" || ci.Branch != "" || ci.Build != 0) {
			t.Errorf("identity %+v without a CI system", ci)
		}
		if ci != DetectCI(env) {
			t.Error("DetectCI is not deterministic")
		}
		if strings.TrimSpace(ci.Repo) != ci.Repo || strings.TrimSpace(ci.Branch) != ci.Branch {
			t.Errorf("untrimmed values in %+v", ci)
		}
	})
}

// TestTwoJobsOfOneRunHaveRunIDsOfTheirOwn: the jobs of one CI run that
// share every CI variable but the ones that tell them apart (a GitHub
// matrix, parallel Jenkins stages, two Tekton TaskRuns of one pipeline)
// get different run ids, and each job's steps agree on its own.
func TestTwoJobsOfOneRunHaveRunIDsOfTheirOwn(t *testing.T) {
	github := map[string]string{"GITHUB_ACTIONS": "true", "GITHUB_REPOSITORY": "acme/shop", "GITHUB_REF_NAME": "main",
		"GITHUB_RUN_NUMBER": "42", "GITHUB_RUN_ID": "5005", "GITHUB_RUN_ATTEMPT": "1", "GITHUB_JOB": "deploy"}
	jenkins := map[string]string{"JENKINS_URL": "https://ci.example.com/", "JOB_NAME": "acme/shop/main", "BRANCH_NAME": "main",
		"BUILD_NUMBER": "19", "BUILD_TAG": "jenkins-acme-shop-main-19", "NODE_NAME": "agent-1", "WORKSPACE": "/ws/shop"}
	tekton := map[string]string{"REPO_OWNER": "acme", "REPO_NAME": "shop", "BRANCH_NAME": "main", "BUILD_NUMBER": "3",
		"KUBERNETES_SERVICE_HOST": "10.0.0.1"}
	for name, jobs := range map[string][2]map[string]string{
		"GitHub matrix entries":             {with(github, "BUILDLOCK_JOB", "0"), with(github, "BUILDLOCK_JOB", "1")},
		"GitHub jobs of one workflow":       {github, with(github, "GITHUB_JOB", "deploy-eu")},
		"Jenkins parallel stages":           {with(jenkins, "STAGE_NAME", "eu"), with(jenkins, "STAGE_NAME", "us")},
		"Jenkins branches on own workspace": {jenkins, with(jenkins, "WORKSPACE", "/ws/shop@2")},
		"Jenkins branches on two agents":    {jenkins, with(jenkins, "NODE_NAME", "agent-2")},
		"Tekton TaskRuns":                   {with(tekton, "BUILDLOCK_JOB", "run-deploy-eu"), with(tekton, "BUILDLOCK_JOB", "run-deploy-us")},
	} {
		a, b := DetectCI(jobs[0]).RunID, DetectCI(jobs[1]).RunID
		if a == "" || a == b {
			t.Errorf("%s: run ids %q and %q, want two different ones", name, a, b)
		}
	}
	// The steps of one Tekton TaskRun run in containers of one pod: the
	// acquire step, which has the pod's UID, and the release step agree.
	step := with(with(tekton, "BUILDLOCK_JOB", "run-deploy"), "HOSTNAME", "run-deploy-pod")
	if a, b := DetectCI(with(step, "POD_UID", "6f1c7a2e-0000-4000-8000-000000000001")).RunID, DetectCI(step).RunID; a != b {
		t.Errorf("two steps of one TaskRun: run ids %q and %q", a, b)
	}
}

func with(env map[string]string, key, value string) map[string]string {
	out := map[string]string{key: value}
	for k, v := range env {
		if k != key {
			out[k] = v
		}
	}
	return out
}

func TestLocalRunID(t *testing.T) {
	for _, tc := range []struct{ user, host, want string }{
		{"alice", "laptop", "alice@laptop"},
		{"alice", "", "alice"},
		{"", "laptop", "laptop"},
		{"", "", ""},
		{"bob", strings.Repeat("h", 200), boundRunID("bob@" + strings.Repeat("h", 200))},
	} {
		if got := LocalRunID(tc.user, tc.host); got != tc.want || validateRunID(got) != nil {
			t.Errorf("LocalRunID(%q, %q) = %q, want %q", tc.user, tc.host, got, tc.want)
		}
	}
}
