package lock

import (
	"cmp"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
)

// The CI systems DetectCI knows, as CI.System names them.
const (
	CIGitHubActions = "GitHub Actions"
	CIGitLab        = "GitLab CI"
	CITekton        = "Tekton/Jenkins X"
	CIJenkins       = "Jenkins"
)

// CI is what DetectCI found in the environment. A field it could not find
// (or parse) is left zero.
type CI struct {
	// System is the CI system the build's identity came from, "" if none.
	System string
	Repo   string
	Branch string
	Build  int64
	// Workflow is what the CI system counts Build in, when that is less
	// than the repository (see Claim.Workflow); empty where the build
	// number counts per repository (GitLab's pipeline IID).
	Workflow string
	// RunID identifies this job of this run of the build: a re-run of a
	// CI job keeps the build number but gets another run id, and two jobs
	// of one CI run (a matrix, parallel stages) get different ones.
	RunID string
	// StateDir is the job's own directory where Acquire keeps the proof
	// that this job made its claim (see Claim.StateDir): the runner's temp
	// directory of GitHub Actions, the workspace's temp directory of
	// Jenkins; empty where the CI system has none.
	StateDir string
	// Pod is the pod this process runs in (its HOSTNAME), set only when it
	// runs in a Kubernetes pod (KUBERNETES_SERVICE_HOST is set); PodUID is
	// its UID when the pod spec passes it in POD_UID (the downward API's
	// metadata.uid).
	Pod, PodUID string
}

// DetectCI reads a build's identity from the usual CI variables in env. The
// first system whose marker is set wins, in this order:
//
//   - GitHub Actions (GITHUB_ACTIONS or GITHUB_REPOSITORY): repo
//     GITHUB_REPOSITORY, branch GITHUB_REF_NAME, build GITHUB_RUN_NUMBER
//     (counted per workflow), workflow GITHUB_WORKFLOW_REF without its
//     "@<ref>", run GITHUB_RUN_ID-GITHUB_RUN_ATTEMPT/GITHUB_JOB;
//   - GitLab CI (GITLAB_CI or CI_PROJECT_PATH): repo CI_PROJECT_PATH, branch
//     CI_COMMIT_REF_NAME, build CI_PIPELINE_IID (counted per project: no
//     workflow), run CI_JOB_ID;
//   - Tekton and Jenkins X (REPO_OWNER and REPO_NAME): repo
//     REPO_OWNER/REPO_NAME, branch BRANCH_NAME, build BUILD_NUMBER,
//     workflow JOB_NAME (Jenkins X's job), run BUILDLOCK_JOB (the Tekton
//     Task passes its TaskRun's name), else the pod's UID (POD_UID), else
//     its name;
//   - Jenkins (JENKINS_URL, or JOB_NAME with BUILD_NUMBER): repo from
//     JOB_NAME (a multibranch job's trailing branch segment dropped, a
//     single-segment job name prefixed with "jenkins/"), branch BRANCH_NAME
//     or else GIT_BRANCH without "origin/", build BUILD_NUMBER (counted per
//     job), workflow JOB_NAME without that branch segment (the job), run
//     BUILD_TAG/STAGE_NAME/<8 hex digits of a hash of NODE_NAME and
//     WORKSPACE>, so that parallel stages, and parallel branches on
//     workspaces of their own, are runs of their own.
//
// Without any of them (a step that passes the build as flags, as the
// Tekton Task does), the run is BUILDLOCK_JOB, else the pod's UID, else
// its name, as for Tekton.
//
// BUILDLOCK_WORKFLOW, when set, is the workflow (the Tekton Task passes its
// pipeline's name), whatever the CI system.
//
// BUILDLOCK_JOB, when set, tells this job from the other jobs of the same
// CI run that share its variables: GitHub exposes none for a matrix entry,
// so the buildlock action passes job.check_run_id (or strategy.job-index).
// It is appended to the run id ("/" and its value), except for Tekton and
// without CI variables, where it is the run id. BUILDLOCK_RUN_ID, when
// set, is the whole run id.
// A run id longer than buildlockv1.MaxRunIDLength, or with control
// characters, is shortened or replaced with a hash of it.
//
// Independently, HOSTNAME is the pod (and POD_UID its UID) when
// KUBERNETES_SERVICE_HOST is set and HOSTNAME is a valid pod name; and the
// job's state directory is BUILDLOCK_STATE_DIR, else RUNNER_TEMP (GitHub
// Actions), else WORKSPACE_TMP (Jenkins). DetectCI is a pure function of
// env.
func DetectCI(env map[string]string) CI {
	get := func(key string) string { return strings.TrimSpace(env[key]) }
	ci := detectSystem(get)
	if get("KUBERNETES_SERVICE_HOST") != "" {
		if host := get("HOSTNAME"); host != "" && len(validation.IsDNS1123Subdomain(host)) == 0 {
			ci.Pod = host
			if uid := get("POD_UID"); podUIDPattern.MatchString(uid) {
				ci.PodUID = uid
			}
		}
	}
	switch job := get("BUILDLOCK_JOB"); {
	case ci.System == CITekton || ci.System == "":
		ci.RunID = cmp.Or(job, ci.PodUID, ci.Pod)
	case ci.RunID != "":
		ci.RunID = joinRunID(ci.RunID, job)
	}
	ci.RunID = boundRunID(cmp.Or(get("BUILDLOCK_RUN_ID"), ci.RunID))
	ci.Workflow = boundWorkflow(cmp.Or(get("BUILDLOCK_WORKFLOW"), ci.Workflow))
	ci.StateDir = cmp.Or(get("BUILDLOCK_STATE_DIR"), get("RUNNER_TEMP"), get("WORKSPACE_TMP"))
	return ci
}

// detectSystem is DetectCI's first step: the CI system whose marker is set,
// and the build and run its variables say.
func detectSystem(get func(string) string) CI {
	switch {
	case get("GITHUB_ACTIONS") == "true" || get("GITHUB_REPOSITORY") != "":
		ci := CI{System: CIGitHubActions, Repo: get("GITHUB_REPOSITORY"), Branch: get("GITHUB_REF_NAME"), Build: parseBuild(get("GITHUB_RUN_NUMBER"))}
		// "acme/shop/.github/workflows/deploy.yml@refs/heads/main": the
		// workflow's path, whatever ref ran it.
		ci.Workflow, _, _ = strings.Cut(get("GITHUB_WORKFLOW_REF"), "@")
		if id := get("GITHUB_RUN_ID"); id != "" {
			ci.RunID = joinRunID(id+"-"+cmp.Or(get("GITHUB_RUN_ATTEMPT"), "1"), get("GITHUB_JOB"))
		}
		return ci
	case get("GITLAB_CI") == "true" || get("CI_PROJECT_PATH") != "":
		return CI{System: CIGitLab, Repo: get("CI_PROJECT_PATH"), Branch: get("CI_COMMIT_REF_NAME"), Build: parseBuild(get("CI_PIPELINE_IID")), RunID: get("CI_JOB_ID")}
	case get("REPO_OWNER") != "" && get("REPO_NAME") != "":
		return CI{System: CITekton, Repo: get("REPO_OWNER") + "/" + get("REPO_NAME"), Branch: get("BRANCH_NAME"), Build: parseBuild(get("BUILD_NUMBER")),
			Workflow: get("JOB_NAME")}
	case get("JENKINS_URL") != "" || (get("JOB_NAME") != "" && get("BUILD_NUMBER") != ""):
		branch := get("BRANCH_NAME")
		if branch == "" {
			branch = strings.TrimPrefix(get("GIT_BRANCH"), "origin/")
		}
		ci := CI{System: CIJenkins, Repo: jenkinsRepo(get("JOB_NAME"), branch), Branch: branch, Build: parseBuild(get("BUILD_NUMBER")),
			Workflow: jenkinsJob(get("JOB_NAME"), branch)}
		if tag := get("BUILD_TAG"); tag != "" {
			var workspace string
			if ws := get("WORKSPACE"); ws != "" {
				workspace = identityHash(get("NODE_NAME"), ws)
			}
			ci.RunID = joinRunID(tag, get("STAGE_NAME"), workspace)
		}
		return ci
	}
	return CI{}
}

// joinRunID joins the non-empty parts of a run id with '/'.
func joinRunID(parts ...string) string {
	return joinNonEmpty("/", parts...)
}

// boundRunID makes a CI system's run id a valid one: one longer than
// buildlockv1.MaxRunIDLength becomes its beginning and 8 hex digits of a
// hash of the whole; one with control characters, that hash alone.
func boundRunID(id string) string {
	runes := []rune(id)
	switch {
	case id != "" && !branchPattern.MatchString(id):
		return identityHash(id)
	case len(runes) > buildlockv1.MaxRunIDLength:
		return string(runes[:buildlockv1.MaxRunIDLength-9]) + "-" + identityHash(id)
	}
	return id
}

// NewRunID returns a random run id, for a run that has none from its CI
// system: every invocation is then a run of its own.
func NewRunID() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b) // crypto/rand.Read never fails
	return hex.EncodeToString(b)
}

// LocalRunID is the run id of a build started by hand, outside CI: the
// person (user, the operating system's user name) on the machine (host).
// Acquiring the same build again from there is the same run, and attaches
// to its claim when the earlier process is gone (see Claim.StateDir);
// while it still runs, or from another machine or account, it is another
// run: "alice@laptop"; an empty part is left out.
func LocalRunID(user, host string) string {
	return boundRunID(strings.Trim(user+"@"+host, "@"))
}

// parseBuild returns s as a build number, or 0 when it is not one.
func parseBuild(s string) int64 {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 1 {
		return 0
	}
	return n
}

// jenkinsRepo turns a Jenkins JOB_NAME into owner/name. A multibranch
// pipeline's JOB_NAME is "<folder>/<repo>/<branch>" with the branch
// URL-encoded ("feature%2Fx"); the branch segment is dropped. Characters
// the API does not accept in a repo become '-'; a single-segment job name
// becomes "jenkins/<job>".
func jenkinsRepo(job, branch string) string {
	var segments []string
	for seg := range strings.SplitSeq(job, "/") {
		if decoded, err := url.PathUnescape(seg); err == nil {
			seg = decoded
		}
		segments = append(segments, seg)
	}
	if branch != "" && len(segments) > 1 && segments[len(segments)-1] == branch {
		segments = segments[:len(segments)-1]
	}
	kept := segments[:0]
	for _, seg := range segments {
		if seg = sanitizeRepoSegment(seg); seg != "" {
			kept = append(kept, seg)
		}
	}
	switch len(kept) {
	case 0:
		return ""
	case 1:
		return "jenkins/" + kept[0]
	}
	return strings.Join(kept, "/")
}

// jenkinsJob is the Jenkins job that counts a build's number: JOB_NAME,
// without a multibranch job's trailing branch segment (each branch of a
// multibranch project counts on its own, and the branch is the line's
// already).
func jenkinsJob(job, branch string) string {
	if head, last, ok := cutLast(job, "/"); ok && branch != "" {
		if decoded, err := url.PathUnescape(last); err == nil && decoded == branch {
			return head
		}
	}
	return job
}

// cutLast slices s around the last sep.
func cutLast(s, sep string) (before, after string, found bool) {
	if i := strings.LastIndex(s, sep); i >= 0 {
		return s[:i], s[i+len(sep):], true
	}
	return s, "", false
}

// boundWorkflow makes a CI system's workflow a valid spec.workflow: one
// longer than buildlockv1.MaxWorkflowLength becomes its end (the file or
// job name) behind 8 hex digits of a hash of the whole; one with control
// characters, that hash alone.
func boundWorkflow(w string) string {
	runes := []rune(w)
	switch {
	case w != "" && !branchPattern.MatchString(w):
		return identityHash(w)
	case len(runes) > buildlockv1.MaxWorkflowLength:
		return identityHash(w) + "-" + string(runes[len(runes)-buildlockv1.MaxWorkflowLength+9:])
	}
	return w
}

// sanitizeRepoSegment turns every run of characters other than letters,
// digits, '_', '.' and '-' into one '-', trimmed at both ends.
func sanitizeRepoSegment(s string) string {
	return strings.Trim(collapseRuns(s, func(r rune) bool {
		return ('a' <= r && r <= 'z') || ('A' <= r && r <= 'Z') || ('0' <= r && r <= '9') || r == '_' || r == '.' || r == '-'
	}), "-")
}
