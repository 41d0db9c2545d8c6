// Runs a declarative Jenkinsfile and the shared-library step buildlock the
// way Jenkins does, as far as it decides what runs (see jenkins_test.go):
//
//   groovy jenkins.groovy LIBRARY_STEP JENKINSFILE
//
// It prints one line per stage ("STAGE <name>: passed|failed|skipped"), the
// build's result ("RESULT <result>") and description ("DESCRIPTION <text>").
//
//   - Executors: `agent` at the top of the pipeline allocates one executor
//     for the whole build (its label, or "agent" for any other kind of
//     agent); `agent none` allocates none, and a stage's own `agent`
//     allocates one for that stage. `node(label)` allocates one for its
//     body. Steps that need a workspace (sh, fileExists, readFile,
//     writeFile, pwd) fail outside an executor, as Jenkins's "Attempted to
//     execute a step that requires a node context" does. The executors held
//     at any moment are written, one label a line, to $JENKINS_EXECUTORS,
//     which the test's stubs read. Every executor shares the test's
//     workspace.
//   - sh runs its script as a file: "sh -xe FILE" (or the file itself when it
//     starts with "#!"), in the workspace, with the build's environment plus
//     NODE_NAME ("<label>-agent") and NODE_LABELS of its executor, which
//     only steps inside an executor see; returnStatus returns the
//     exit code, returnStdout the output, and otherwise a non-zero exit code
//     fails the step.
//   - withEnv sets variables for the steps in its body (in its branch only).
//   - parallel runs its branches at once; with failFast a failed branch
//     aborts the others (their running sh processes get SIGTERM, with every
//     descendant, as Jenkins kills a step's process tree), and parallel
//     fails with the first failure. waitUntil repeats its body until it is
//     true, sleeping in between (aborted with its branch).
//   - error fails the step; an error in a stage fails the stage, later stages
//     are skipped, and the build's result becomes FAILURE unless it is
//     already worse (currentBuild.result only ever gets worse, as in Jenkins:
//     SUCCESS, UNSTABLE, FAILURE, NOT_BUILT, ABORTED).
//   - a stage's steps see its name in STAGE_NAME; checkout is a no-op.
//   - options blocks are not run.

import java.util.concurrent.ConcurrentHashMap

class StepFailure extends RuntimeException {
    StepFailure(String message) { super(message) }
}

// Aborted is what a branch that failFast stops sees.
class Aborted extends StepFailure {
    Aborted() { super('aborted (another parallel branch failed)') }
}

// Context is what a step sees: its variables, its executor, whether its
// branch was aborted, and the process its sh runs.
class Context {
    Map<String, String> env
    String node
    volatile boolean aborted = false
    volatile Process process = null
    List<Context> children = Collections.synchronizedList([])

    Context fork(Map<String, String> newEnv, String newNode) {
        Context c = new Context(env: newEnv, node: newNode)
        if (aborted) {
            c.aborted = true
        }
        children << c
        return c
    }

    void abort() {
        aborted = true
        Process p = process
        if (p != null) {
            p.descendants().forEach { it.destroy() }
            p.destroy()
        }
        children.each { it.abort() }
    }

    void check() {
        if (aborted) {
            throw new Aborted()
        }
    }
}

class Build {
    static final List<String> ORDER = ['SUCCESS', 'UNSTABLE', 'FAILURE', 'NOT_BUILT', 'ABORTED']
    String result = 'SUCCESS'
    String description = null
    File workspace = new File(System.getenv('WORKSPACE') ?: '.')
    File executorsFile = new File(System.getenv('JENKINS_EXECUTORS'))
    List<String> executors = []
    ThreadLocal<Context> current = new ThreadLocal<Context>()

    Context ctx() { current.get() }

    synchronized void setResult(String r) {
        if (ORDER.indexOf(r) > ORDER.indexOf(result)) {
            result = r
        }
    }

    synchronized void allocate(String label, boolean take) {
        if (take) {
            executors << label
        } else {
            executors.remove(label)
        }
        executorsFile.text = executors.collect { it + '\n' }.join('')
    }

    def inNode(String label, Closure body) {
        Context outer = ctx()
        Map<String, String> env = new LinkedHashMap<String, String>(outer.env)
        env['NODE_NAME'] = label + '-agent'
        env['NODE_LABELS'] = label
        allocate(label, true)
        current.set(outer.fork(env, label))
        try {
            return body()
        } finally {
            current.set(outer)
            allocate(label, false)
        }
    }

    void needNode(String step) {
        if (ctx().node == null) {
            throw new StepFailure("Attempted to execute a step that requires a node context (${step}) outside node")
        }
    }

    File file(String path) {
        File f = new File(path)
        return f.absolute ? f : new File(workspace, path)
    }

    def sh(Map a) {
        Context c = ctx()
        c.check()
        needNode('sh')
        File file = File.createTempFile('script', '.sh')
        file.deleteOnExit()
        file.text = a.script
        List<String> cmd = a.script.startsWith('#!') ? [file.path] : ['sh', '-xe', file.path]
        file.setExecutable(true)
        ProcessBuilder pb = new ProcessBuilder(cmd)
        pb.directory(workspace)
        pb.environment().clear()
        pb.environment().putAll(c.env)
        pb.redirectError(ProcessBuilder.Redirect.INHERIT)
        if (!a.returnStdout) {
            pb.redirectOutput(ProcessBuilder.Redirect.INHERIT)
        }
        Process p = pb.start()
        c.process = p
        if (c.aborted) {
            c.abort()
        }
        String out = a.returnStdout ? p.inputStream.text : null
        int code = p.waitFor()
        c.process = null
        c.check()
        if (a.returnStatus) {
            return code
        }
        if (code != 0) {
            throw new StepFailure("script returned exit code ${code}")
        }
        return out
    }

    def withEnv(List vars, Closure body) {
        Context outer = ctx()
        Map<String, String> env = new LinkedHashMap<String, String>(outer.env)
        vars.each { String kv ->
            int i = kv.indexOf('=')
            env[kv.substring(0, i)] = kv.substring(i + 1)
        }
        Context inner = outer.fork(env, outer.node)
        current.set(inner)
        try {
            return body()
        } finally {
            current.set(outer)
        }
    }

    def parallel(Map branches) {
        Map<String, Closure> named = new LinkedHashMap<String, Closure>(branches)
        boolean failFast = named.remove('failFast') ?: false
        Context parent = ctx()
        List<Context> contexts = []
        List<Throwable> failures = Collections.synchronizedList([])
        List<Thread> threads = []
        named.each { String name, Closure branch ->
            Context c = parent.fork(new LinkedHashMap<String, String>(parent.env), parent.node)
            contexts << c
            threads << Thread.start(name) {
                current.set(c)
                try {
                    branch()
                } catch (Throwable e) {
                    failures << e
                    if (failFast) {
                        contexts.findAll { it != c }.each { it.abort() }
                    }
                }
            }
        }
        threads.each { it.join() }
        parent.check()
        Throwable first = failures.find { !(it instanceof Aborted) } ?: (failures ? failures[0] : null)
        if (first != null) {
            throw first
        }
    }

    def waitUntil(Map a, Closure condition) {
        while (true) {
            ctx().check()
            if (condition()) {
                return
            }
            Thread.sleep(50)
        }
    }
}

// EnvProxy is `env`: env.NAME reads the calling branch's variables.
class EnvProxy {
    Build build
    def getProperty(String name) { build.ctx().env[name] }
}

class PipelineDsl {
    // The pipeline's agent: null for `agent none`.
    String agent = 'agent'
    List<List> stages = []
    def getNone() { null }
    def getAny() { 'agent' }
    def agent(Object a) { agent = AgentDsl.labelOf(a) }
    def options(Closure c) {}
    def stages(Closure c) {
        c.delegate = this
        c.resolveStrategy = Closure.DELEGATE_FIRST
        c()
    }
    def stage(String name, Closure c) { stages << [name, c] }
}

// AgentDsl reads an agent block: `label 'x'` is x, any other kind
// (kubernetes, docker) is "agent".
class AgentDsl {
    String label = 'agent'
    def label(String l) { label = l }
    def methodMissing(String name, args) { label = 'agent' }
    static String labelOf(Object a) {
        if (a == null || a instanceof String) {
            return a
        }
        AgentDsl d = new AgentDsl()
        Closure c = (Closure) a
        c.delegate = d
        c.resolveStrategy = Closure.DELEGATE_FIRST
        c()
        return d.label
    }
}

class StageDsl {
    boolean hasAgent = false
    String agent = null
    Closure body = null
    def getNone() { null }
    def getAny() { 'agent' }
    def agent(Object a) { hasAgent = true; agent = AgentDsl.labelOf(a) }
    def steps(Closure c) { body = c }
}

Build build = new Build()
// NODE_NAME and NODE_LABELS are an executor's: set inside node only.
Map<String, String> buildEnv = new LinkedHashMap<String, String>(System.getenv())
buildEnv.remove('NODE_NAME')
buildEnv.remove('NODE_LABELS')
build.current.set(new Context(env: buildEnv, node: null))
Binding binding = new Binding()
binding.setVariable('env', new EnvProxy(build: build))
binding.setVariable('currentBuild', build)
binding.setVariable('sh', { a -> build.sh(a instanceof Map ? a : [script: a]) })
binding.setVariable('withEnv', { List vars, Closure body -> build.withEnv(vars, body) })
binding.setVariable('error', { message -> throw new StepFailure(message.toString()) })
binding.setVariable('echo', { message -> println message })
binding.setVariable('node', { String label, Closure body -> build.inNode(label, body) })
binding.setVariable('parallel', { Map branches -> build.parallel(branches) })
binding.setVariable('waitUntil', { Map a, Closure c -> build.waitUntil(a, c) })
binding.setVariable('checkout', { x -> build.needNode('checkout') })
binding.setVariable('scm', 'scm')
binding.setVariable('pwd', { Map a ->
    build.needNode('pwd')
    a.tmp ? build.workspace.path + '@tmp' : build.workspace.path
})
binding.setVariable('fileExists', { String path -> build.needNode('fileExists'); build.file(path).exists() })
binding.setVariable('readFile', { String path -> build.needNode('readFile'); build.file(path).text })
binding.setVariable('writeFile', { Map a ->
    build.needNode('writeFile')
    File f = build.file(a.file)
    f.parentFile.mkdirs()
    f.text = a.text
})

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

def runStages = {
    boolean failed = false
    dsl.stages.each { stage ->
        String name = stage[0]
        Closure c = stage[1]
        if (failed) {
            println "STAGE ${name}: skipped"
            return
        }
        StageDsl s = new StageDsl()
        c.delegate = s
        c.resolveStrategy = Closure.DELEGATE_FIRST
        c()
        try {
            build.withEnv(["STAGE_NAME=${name}"]) {
                if (s.hasAgent && s.agent != null) {
                    build.inNode(s.agent, s.body)
                } else {
                    s.body()
                }
            }
            println "STAGE ${name}: passed"
        } catch (StepFailure e) {
            failed = true
            build.setResult('FAILURE')
            println "ERROR: ${e.message}"
            println "STAGE ${name}: failed"
        }
    }
}
if (dsl.agent != null) {
    build.inNode(dsl.agent, runStages)
} else {
    runStages()
}
println "RESULT ${build.result}"
if (build.description != null) {
    println "DESCRIPTION ${build.description}"
}
