package main

const exitCodesHelp = `Exit codes:
  0         the lock is held (with -- CMD: CMD's exit code, after releasing)
  1         error (API server, permissions, no operator, ...)
  2         usage error
  3         superseded: a newer build will deploy; stop without deploying (not a failure)
  4         timed out waiting (--timeout); the claim was deleted
  5         the claim ended otherwise before it held (released or expired)
  126, 127  CMD could not be started (not executable, not found); the lock was released
  130, 143  interrupted by SIGINT or SIGTERM; the claim was deleted
`

const kubeFlagsHelp = `Flags of every command:
  --kubeconfig PATH   kubeconfig file (default: $KUBECONFIG, ~/.kube/config, else in-cluster)
  --context NAME      kubeconfig context
  -n, --namespace NS  namespace of the BuildLocks, the pipeline's own (default: the context's, or the pod's)
`

const usage = `kubectl buildlock makes pipelines take turns deploying into a target.

A build claims a target (a BuildLock in the pipeline's namespace); the buildlock
operator grants it to one build at a time, gives the waiting slot to the newest
build, and supersedes older ones, which then stop without deploying.

Usage:
  kubectl buildlock acquire --target T [--repo R --branch B --build N] [--pod P] [--timeout D] [--expires-after D] [-- CMD ARGS...]
  kubectl buildlock release NAME | --target T --mine
  kubectl buildlock status [--target T] [-A] [-o table|json|yaml]
  kubectl buildlock force-release --target T --reason "..."
  kubectl buildlock help COMMAND

Commands:
  acquire        Claim a target and wait until it is held; optionally run a command while holding it
  release        Release a claim (delete its BuildLock)
  status         Show who holds and who waits for each target
  force-release  Ask the operator to end the current hold of a target

Examples:
  # Deploy while holding the lock on staging; repo, branch and build come from CI variables
  kubectl buildlock acquire --target staging -- ./deploy.sh staging

  # Take the lock now, deploy in later steps, release at the end
  TOKEN=$(kubectl buildlock acquire --target staging --timeout 30m)
  kubectl buildlock release --target staging --mine

  # Who holds what
  kubectl buildlock status -A

  # End a stuck hold
  kubectl buildlock force-release --target staging --reason "deploy job hangs, see INC-123"

` + exitCodesHelp + `
` + kubeFlagsHelp + `
Run 'kubectl buildlock COMMAND --help' for a command's flags and examples.
`

var commandHelp = map[string]string{
	"acquire": `Claim a target for this build and wait (with a watch) until the operator's verdict.

Usage:
  kubectl buildlock acquire --target T [flags] [-- CMD ARGS...]

Without CMD, prints the fencing token on stdout and exits 0 once the lock is held;
the claim stays until it is released (kubectl buildlock release), its pod ends,
or, without a pod, --expires-after passes.

With -- CMD, runs CMD once the lock is held, with BUILDLOCK_FENCING_TOKEN,
BUILDLOCK_NAME, BUILDLOCK_NAMESPACE and BUILDLOCK_TARGET in its environment and
its output passed through; then releases the lock whatever CMD's result and
exits with CMD's code. A claim without a pod is renewed while CMD runs.

SIGINT or SIGTERM while waiting deletes the claim and exits 130 or 143. While
CMD runs, the signal is passed on to CMD; when CMD exits, the lock is released
and the plugin exits 130 or 143. A second signal kills CMD.

The BuildLock is named <repo>-<branch>-<build>-<target> (DNS-safe, at most 63
characters, shortened with a hash when longer). Running the same acquire again
(a retried step) waits on the same claim instead of creating a second one.

Flags:
  --target T           the namespace the build deploys into (required)
  --repo OWNER/NAME    the repository (default: from CI variables)
  --branch B           the branch that was built (default: from CI variables)
  --build N            the build number, higher is newer (default: from CI variables)
  --pod P              the pipeline's pod in the claims' namespace; the claim lives as long as the pod
                       (default: $HOSTNAME when running in a pod of that namespace; --pod= for none)
  --pod-uid UID        the pod's UID, so that a replaced pod of the same name does not count
  --name NAME          the BuildLock's name (default: derived)
  --timeout D          give up waiting after D (exit 4, the claim is deleted); 0 waits until interrupted
  --expires-after D    without a pod: how long a hold lasts unless renewed, 10s to 24h
                       (default: 2m with -- CMD, renewed every third of it; else the API's 1h)

CI variables read when flags are absent (the first system found wins):
  GitHub Actions     GITHUB_REPOSITORY, GITHUB_REF_NAME, GITHUB_RUN_NUMBER
  GitLab CI          CI_PROJECT_PATH, CI_COMMIT_REF_NAME, CI_PIPELINE_IID
  Tekton, Jenkins X  REPO_OWNER/REPO_NAME, BRANCH_NAME, BUILD_NUMBER
  Jenkins            JOB_NAME, BRANCH_NAME (or GIT_BRANCH), BUILD_NUMBER
  in a pod           HOSTNAME as --pod (when KUBERNETES_SERVICE_HOST is set)

Examples:
  # Deploy to staging while holding its lock; exit 3 means a newer build will deploy instead
  kubectl buildlock acquire --target staging --timeout 30m -- ./deploy.sh

  # Outside CI, say who you are
  kubectl buildlock acquire -n ci --target staging --repo acme/shop --branch main --build 42 -- make deploy

  # Hold the lock across several steps
  TOKEN=$(kubectl buildlock acquire --target staging --expires-after 45m)

` + exitCodesHelp + `
` + kubeFlagsHelp,

	"release": `Release a claim: delete its BuildLock, so that the next build may deploy.

Usage:
  kubectl buildlock release NAME
  kubectl buildlock release --target T --mine [--repo R --branch B --build N]

--mine releases this build's claims on T: the build is found as acquire finds
it (flags, else CI variables). A claim that is already gone counts as released.
To end another build's hold, use force-release.

Examples:
  kubectl buildlock release acme-shop-main-42-staging -n ci

  # In the final step of a pipeline (runs also when earlier steps failed)
  kubectl buildlock release --target staging --mine

Exit codes: 0 released (or already gone), 1 error, 2 usage error.

` + kubeFlagsHelp,

	"status": `Show, for each target, who holds the lock (build and how long), who waits, and the
holder's fencing token.

Usage:
  kubectl buildlock status [--target T] [-A] [-o table|json|yaml]

Flags:
  --target T              only this target
  -A, --all-namespaces    every namespace
  -o, --output FORMAT     table (default), json or yaml

Examples:
  kubectl buildlock status
  kubectl buildlock status -A
  kubectl buildlock status --target staging -o json

Exit codes: 0 shown, 1 error, 2 usage error.

` + kubeFlagsHelp,

	"force-release": `Ask the operator to end the current hold of a target, recording who and why.

The holding BuildLock is annotated buildlock.io/force-release="<who>: <reason>"
(who is your user name, as the API server sees it) and a Warning event
ForceRelease is recorded on it. The operator then releases the hold (phase
Released, reason ForceReleased) and grants the lock to the waiting build.

Usage:
  kubectl buildlock force-release --target T --reason "..."

Examples:
  kubectl buildlock force-release -n ci --target staging --reason "deploy hangs since 09:12, INC-123"

Exit codes: 0 requested, 1 error or no holder, 2 usage error.

Needs patch on buildlocks and create on events in the namespace.

` + kubeFlagsHelp,
}
