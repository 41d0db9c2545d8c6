// buildlock: a Jenkins shared-library step that runs its body while this
// build holds the buildlock of a target namespace, so that builds take turns
// deploying there.
//
//   @Library('buildlock@v0.2.0') _
//   ...
//   // In a stage without an agent: the wait takes no deploy executor.
//   buildlock(target: 'staging', waitOn: 'buildlock') {
//     node('deploy') {
//       checkout scm
//       sh './deploy.sh staging'
//     }
//   }
//
// Load this repository as a global pipeline library named buildlock, pinned
// to a release tag. The agent that runs kubectl-buildlock needs it on its
// PATH and access to the cluster as a service account bound to
// buildlock-pipeline (examples/jenkins/rbac.yaml).
//
// Where the plugin runs:
//   - Called outside node (a stage with `agent none`, or scripted Pipeline
//     outside node), the step runs the plugin on an agent of the label
//     waitOn: a small one (a pod of the image ghcr.io/buildlock/kubectl-buildlock,
//     which has the plugin and sh, or a static agent with many executors).
//     Waiting for the lock takes none of the executors the body uses: the body
//     allocates its own node, once the lock is held.
//   - Called inside node, the plugin runs on that node (which the wait then
//     keeps busy, as before).
//
//   1. `kubectl-buildlock acquire` claims the target and waits for the lock.
//      Repo, branch and build come from JOB_NAME, BRANCH_NAME and
//      BUILD_NUMBER; on a Kubernetes agent in the claims' namespace the claim
//      names the agent pod, and the operator releases it when the pod ends.
//      Each stage claims for itself: its run id is BUILD_TAG, STAGE_NAME and
//      the agent's workspace, so parallel stages of one build never share a
//      claim.
//   2. Once held, the plugin keeps holding while the body runs: it renews a
//      claim without a pod every third of expiresAfter (so a hold has no cap
//      but the target's maximum hold), and writes the fencing token where the
//      step reads it. The body runs, in a parallel branch of its own, with
//      BUILDLOCK_FENCING_TOKEN and BUILDLOCK_TARGET set.
//   3. When the body ends, whatever it did, the plugin releases the lock. If
//      the claim stops holding while the body runs (force-released, deleted,
//      expired), the body is aborted and the step fails: the lock may be
//      another build's now.
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
// expiresAfter, how long a hold without a pod lasts without renewal (10s to
// 24h; the plugin renews it every third of that while the body runs; default
// 2m); rollback: true to deploy this build on purpose even if a higher build
// of the job already deployed, with reason, why (recorded in the lock's
// audit); waitOn, the label of the agent the plugin runs on when the step is
// called outside node.
//
// Values reach the shell through withEnv only: the scripts below are
// single-quoted Groovy strings, in which nothing is interpolated.

def call(Map args = [:], Closure body) {
    def known = ['target', 'timeout', 'namespace', 'expiresAfter', 'rollback', 'reason', 'waitOn']
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
    // NODE_NAME is set inside node only.
    boolean inNode = env.NODE_NAME != null
    String waitOn = args.waitOn ?: ''
    if (!inNode && !waitOn) {
        error("buildlock: called outside node, the step needs an agent to run kubectl-buildlock on: say which with waitOn: '<label>' " +
              "(a small agent, such as a pod of the kubectl-buildlock image), or call it inside node")
    }
    // What the parallel branches below tell each other.
    def state = [token: null, status: null, holdEnded: false, bodyDone: false, bodyError: null, result: null, lost: false]
    def onPluginAgent = { Closure steps -> inNode ? steps() : node(waitOn) { steps() } }
    def failure = null
    withEnv([
        "BUILDLOCK_ARG_TARGET=${target}",
        "BUILDLOCK_ARG_TIMEOUT=${args.timeout ?: '30m'}",
        "BUILDLOCK_ARG_NAMESPACE=${args.namespace ?: ''}",
        "BUILDLOCK_ARG_EXPIRES_AFTER=${args.expiresAfter ?: ''}",
        "BUILDLOCK_ARG_ROLLBACK=${args.rollback ? 'true' : ''}",
        "BUILDLOCK_ARG_REASON=${args.reason ?: ''}",
    ]) {
        try {
            parallel(failFast: true,
                "buildlock: hold ${target}": {
                    onPluginAgent {
                        String dir = "${pwd(tmp: true)}/buildlock-${target}-${UUID.randomUUID()}"
                        withEnv(["BUILDLOCK_HOLD_DIR=${dir}"]) {
                            parallel(
                                "buildlock: acquire ${target}": {
                                    try {
                                        // The plugin holds while its command runs: the command
                                        // hands the token over and waits for the body to end.
                                        state.status = sh(label: "buildlock: acquire ${target}", returnStatus: true, script: '''
                                            mkdir -p "$BUILDLOCK_HOLD_DIR"
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
                                            # shellcheck disable=SC2016 # the inner sh expands them
                                            kubectl-buildlock "$@" -- sh -c '
                                              printf "%s" "$BUILDLOCK_FENCING_TOKEN" > "$BUILDLOCK_HOLD_DIR/token.part"
                                              mv "$BUILDLOCK_HOLD_DIR/token.part" "$BUILDLOCK_HOLD_DIR/token"
                                              while [ ! -e "$BUILDLOCK_HOLD_DIR/done" ]; do sleep 1; done'
                                        ''')
                                    } finally {
                                        state.holdEnded = true
                                    }
                                },
                                "buildlock: hand over ${target}": {
                                    waitUntil(quiet: true) { state.holdEnded || fileExists("${dir}/token") }
                                    if (fileExists("${dir}/token")) {
                                        state.token = readFile("${dir}/token").trim()
                                    }
                                    waitUntil(quiet: true) { state.holdEnded || state.bodyDone }
                                    writeFile(file: "${dir}/done", text: '')
                                },
                            )
                        }
                    }
                    if (state.token != null && !state.bodyDone) {
                        // failFast aborts the body: the lock may be another build's now.
                        state.lost = true
                        error("buildlock: the claim on ${target} stopped holding")
                    }
                },
                "buildlock: ${target}": {
                    waitUntil(quiet: true) { state.holdEnded || state.token != null }
                    if (state.token == null) {
                        return
                    }
                    try {
                        withEnv(["BUILDLOCK_FENCING_TOKEN=${state.token}", "BUILDLOCK_TARGET=${target}"]) {
                            state.result = body()
                        }
                    } catch (e) {
                        state.bodyError = e
                    } finally {
                        state.bodyDone = true
                    }
                },
            )
        } catch (e) {
            failure = e
        }
    }
    if (state.token == null) {
        if (state.status == 3) {
            currentBuild.result = 'NOT_BUILT'
            currentBuild.description = "Superseded on ${target}: not deployed"
            error("buildlock: superseded on ${target}: this build will not deploy (the plugin says why above, and what to do). This build stops here (result NOT_BUILT); it is not a deploy failure.")
        }
        if (state.status != null) {
            error("buildlock: taking the lock of ${target} failed with exit code ${state.status} (4: timed out, 5: the claim ended, 6: another run's claim, 7: frozen; the plugin says why above)")
        }
    }
    if (state.lost) {
        error("buildlock: the claim on ${target} stopped holding while the body ran (exit code ${state.status}; the plugin says why above): the body was stopped, since the lock may be another build's now")
    }
    if (state.bodyError != null) {
        throw state.bodyError
    }
    if (failure != null) {
        throw failure
    }
    return state.result
}
