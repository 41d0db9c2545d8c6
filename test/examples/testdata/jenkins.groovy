// Runs a declarative Jenkinsfile and the shared-library step buildlock the
// way Jenkins does, as far as it decides what runs (see jenkins_test.go):
//
//   groovy jenkins.groovy LIBRARY_STEP JENKINSFILE
//
// It prints one line per stage ("STAGE <name>: passed|failed|skipped"), the
// build's result ("RESULT <result>") and description ("DESCRIPTION <text>").
//
//   - sh runs its script as a file: "sh -xe FILE" (or the file itself when it
//     starts with "#!"), in the current directory, with the build's
//     environment; returnStatus returns the exit code, returnStdout the
//     output, and otherwise a non-zero exit code fails the step.
//   - withEnv sets variables for the steps in its body.
//   - error fails the step; an error in a stage fails the stage, later stages
//     are skipped, and the build's result becomes FAILURE unless it is
//     already worse (currentBuild.result only ever gets worse, as in Jenkins:
//     SUCCESS, UNSTABLE, FAILURE, NOT_BUILT, ABORTED).
//   - a stage's steps see its name in STAGE_NAME.
//   - agent and options blocks are not run: the test is the agent.

class StepFailure extends RuntimeException {
    StepFailure(String message) { super(message) }
}

class Build {
    static final List<String> ORDER = ['SUCCESS', 'UNSTABLE', 'FAILURE', 'NOT_BUILT', 'ABORTED']
    Map<String, String> env = new LinkedHashMap<String, String>(System.getenv())
    String result = 'SUCCESS'
    String description = null

    void setResult(String r) {
        if (ORDER.indexOf(r) > ORDER.indexOf(result)) {
            result = r
        }
    }

    def sh(Map a) {
        File file = File.createTempFile('script', '.sh')
        file.deleteOnExit()
        file.text = a.script
        List<String> cmd = a.script.startsWith('#!') ? [file.path] : ['sh', '-xe', file.path]
        file.setExecutable(true)
        ProcessBuilder pb = new ProcessBuilder(cmd)
        pb.environment().clear()
        pb.environment().putAll(env)
        pb.redirectError(ProcessBuilder.Redirect.INHERIT)
        if (!a.returnStdout) {
            pb.redirectOutput(ProcessBuilder.Redirect.INHERIT)
        }
        Process p = pb.start()
        String out = a.returnStdout ? p.inputStream.text : null
        int code = p.waitFor()
        if (a.returnStatus) {
            return code
        }
        if (code != 0) {
            throw new StepFailure("script returned exit code ${code}")
        }
        return out
    }

    def withEnv(List vars, Closure body) {
        Map<String, String> saved = new LinkedHashMap<String, String>(env)
        vars.each { String kv ->
            int i = kv.indexOf('=')
            env[kv.substring(0, i)] = kv.substring(i + 1)
        }
        try {
            return body()
        } finally {
            env.clear()
            env.putAll(saved)
        }
    }
}

class PipelineDsl {
    List<List> stages = []
    def agent(Closure c) {}
    def options(Closure c) {}
    def stages(Closure c) {
        c.delegate = this
        c.resolveStrategy = Closure.DELEGATE_FIRST
        c()
    }
    def stage(String name, Closure c) { stages << [name, c] }
}

class StageDsl {
    def steps(Closure c) { c() }
}

Build build = new Build()
Binding binding = new Binding()
binding.setVariable('env', build.env)
binding.setVariable('currentBuild', build)
binding.setVariable('sh', { a -> build.sh(a instanceof Map ? a : [script: a]) })
binding.setVariable('withEnv', { List vars, Closure body -> build.withEnv(vars, body) })
binding.setVariable('error', { message -> throw new StepFailure(message.toString()) })
binding.setVariable('echo', { message -> println message })

GroovyShell shell = new GroovyShell(binding)
Script library = shell.parse(new File(args[0]))
binding.setVariable('buildlock', { Map a, Closure body -> library.invokeMethod('call', [a, body] as Object[]) })

PipelineDsl dsl = new PipelineDsl()
binding.setVariable('pipeline', { Closure c ->
    c.delegate = dsl
    c.resolveStrategy = Closure.DELEGATE_FIRST
    c()
})
// @Library loads the library; here the binding has it already.
String jenkinsfile = new File(args[1]).text.readLines().findAll { !it.startsWith('@Library') }.join('\n')
shell.evaluate(jenkinsfile, 'Jenkinsfile')

boolean failed = false
dsl.stages.each { stage ->
    String name = stage[0]
    Closure c = stage[1]
    if (failed) {
        println "STAGE ${name}: skipped"
        return
    }
    c.delegate = new StageDsl()
    c.resolveStrategy = Closure.DELEGATE_FIRST
    build.env['STAGE_NAME'] = name
    try {
        c()
        println "STAGE ${name}: passed"
    } catch (StepFailure e) {
        failed = true
        build.setResult('FAILURE')
        println "ERROR: ${e.message}"
        println "STAGE ${name}: failed"
    }
}
println "RESULT ${build.result}"
if (build.description != null) {
    println "DESCRIPTION ${build.description}"
}
