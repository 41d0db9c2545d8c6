// buildlock: a Jenkins shared-library step that runs its body while this
// build holds the buildlock of a target namespace, so that builds take turns
// deploying there.
//
//   @Library('buildlock@v0.2.0') _
//   ...
//   buildlock(target: 'staging') {
//     sh './deploy.sh staging'
//   }
//
// Load this repository as a global pipeline library named buildlock, pinned
// to a release tag. The agent needs kubectl-buildlock on its PATH and access
// to the cluster as a service account bound to buildlock-pipeline
// (examples/jenkins/rbac.yaml).
//
//   1. `kubectl-buildlock acquire` claims the target and waits for the lock.
//      Repo, branch and build come from JOB_NAME, BRANCH_NAME and
//      BUILD_NUMBER; on a Kubernetes agent in the claims' namespace the claim
//      names the agent pod, and the operator releases it when the pod ends.
//      Each stage claims for itself: its run id is BUILD_TAG, STAGE_NAME and
//      the agent's workspace, so parallel stages of one build never share a
//      claim, and the release below finds this stage's own.
//   2. The body runs with BUILDLOCK_FENCING_TOKEN and BUILDLOCK_TARGET set.
//   3. The lock is released, whatever the body did.
//
// When this build is superseded (a newer build goes instead, a higher one
// already deployed, another run of it holds: the plugin's log says which),
// the body does not run: the build's result becomes NOT_BUILT (as when the
// milestone step aborts an older build), its description says so, and the
// step fails, so that no later stage runs. A replay or rebuild keeps the
// build number and deploys again once the first run's claim has ended. The
// claim's line is the job (JOB_NAME), which numbers its builds.
//
// Arguments: target (required); timeout, how long to wait (default '30m');
// namespace, of the claims (default: the kubeconfig's, or the agent pod's);
// expiresAfter, how long a hold lasts when the agent is no pod in the claims'
// namespace (nothing renews the claim while the body runs; default 1h);
// rollback: true to deploy this build on purpose even if a higher build of
// the job already deployed, with reason, why (recorded in the lock's audit).
//
// Values reach the shell through withEnv only: the scripts below are
// single-quoted Groovy strings, in which nothing is interpolated.

def call(Map args = [:], Closure body) {
    def known = ['target', 'timeout', 'namespace', 'expiresAfter', 'rollback', 'reason']
    def unknown = args.keySet().findAll { !(it in known) }
    if (unknown) {
        error("buildlock: unknown argument(s) ${unknown}; the arguments are ${known}")
    }
    String target = args.target ?: ''
    if (!(target ==~ /[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?/)) {
        error("buildlock: target must be a namespace name, as in buildlock(target: 'staging') { ... }")
    }
    if (!(args.rollback in [null, true, false])) {
        error("buildlock: rollback must be true or false")
    }
    if (args.rollback && !(args.reason ?: '').trim()) {
        error("buildlock: rollback needs a reason, as in buildlock(target: 'staging', rollback: true, reason: 'INC-7') { ... }")
    }
    def result = null
    withEnv([
        "BUILDLOCK_ARG_TARGET=${target}",
        "BUILDLOCK_ARG_TIMEOUT=${args.timeout ?: '30m'}",
        "BUILDLOCK_ARG_NAMESPACE=${args.namespace ?: ''}",
        "BUILDLOCK_ARG_EXPIRES_AFTER=${args.expiresAfter ?: ''}",
        "BUILDLOCK_ARG_ROLLBACK=${args.rollback ? 'true' : ''}",
        "BUILDLOCK_ARG_REASON=${args.reason ?: ''}",
    ]) {
        // Prints "<exit code> <fencing token>": the plugin prints the token on
        // stdout and everything else on stderr.
        List<String> acquired = sh(label: "buildlock: acquire ${target}", returnStdout: true, script: '''
            set -- acquire --target "$BUILDLOCK_ARG_TARGET" --timeout "$BUILDLOCK_ARG_TIMEOUT"
            if [ -n "$BUILDLOCK_ARG_NAMESPACE" ]; then
              set -- "$@" --namespace "$BUILDLOCK_ARG_NAMESPACE"
            fi
            if [ -n "$BUILDLOCK_ARG_EXPIRES_AFTER" ]; then
              set -- "$@" --expires-after "$BUILDLOCK_ARG_EXPIRES_AFTER"
            fi
            if [ -n "$BUILDLOCK_ARG_ROLLBACK" ]; then
              set -- "$@" --rollback --reason "$BUILDLOCK_ARG_REASON"
            fi
            status=0
            token="$(kubectl-buildlock "$@")" || status=$?
            echo "$status $token"
        ''').trim().tokenize(' ')
        int status = acquired[0] as int
        if (status == 3) {
            currentBuild.result = 'NOT_BUILT'
            currentBuild.description = "Superseded on ${target}: not deployed"
            error("buildlock: superseded on ${target}: this build will not deploy (the plugin says why above, and what to do). This build stops here (result NOT_BUILT); it is not a deploy failure.")
        }
        if (status != 0 || acquired.size() != 2) {
            error("buildlock: taking the lock of ${target} failed with exit code ${status} (4: timed out, 5: the claim ended; the plugin says why above)")
        }
        try {
            withEnv(["BUILDLOCK_FENCING_TOKEN=${acquired[1]}", "BUILDLOCK_TARGET=${target}"]) {
                result = body()
            }
        } finally {
            // A failed release must not hide the body's error: the claim ends
            // with the agent pod, or expires, anyway.
            int released = sh(label: "buildlock: release ${target}", returnStatus: true, script: '''
                set -- release --target "$BUILDLOCK_ARG_TARGET" --mine
                if [ -n "$BUILDLOCK_ARG_NAMESPACE" ]; then
                  set -- "$@" --namespace "$BUILDLOCK_ARG_NAMESPACE"
                fi
                kubectl-buildlock "$@"
            ''')
            if (released != 0) {
                echo "buildlock: releasing ${target} failed (exit code ${released}); the claim ends with the agent pod or expires"
            }
        }
    }
    return result
}
