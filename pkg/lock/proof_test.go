package lock

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
)

// TestAProofProvesOnlyItsOwnClaim: the claim must carry the secret's hash
// and the name and UID the proof recorded; the hash copied onto another
// claim proves nothing.
func TestAProofProvesOnlyItsOwnClaim(t *testing.T) {
	p := &proof{}
	p.renew("acme-shop-main-42-staging")
	p.state.UID = "uid-1"
	claim := func(change func(bl *buildlockv1.BuildLock)) *buildlockv1.BuildLock {
		bl := Claim{Namespace: "ci", Target: "staging", Repo: "acme/shop", Branch: "main", Build: 42, RunID: "1-1"}.BuildLock()
		bl.UID = "uid-1"
		bl.Annotations[buildlockv1.RunProofAnnotation] = p.annotation()
		change(bl)
		return bl
	}
	tests := map[string]struct {
		bl    *buildlockv1.BuildLock
		proof func() *proof
		want  bool
	}{
		"its own claim":                      {bl: claim(func(*buildlockv1.BuildLock) {}), want: true},
		"the hash copied onto another claim": {bl: claim(func(bl *buildlockv1.BuildLock) { bl.UID = "uid-2" })},
		"another secret's hash": {bl: claim(func(bl *buildlockv1.BuildLock) {
			bl.Annotations[buildlockv1.RunProofAnnotation] = proofAnnotation("guessed")
		})},
		"the secret itself instead of its hash": {bl: claim(func(bl *buildlockv1.BuildLock) {
			bl.Annotations[buildlockv1.RunProofAnnotation] = p.state.Nonce
		})},
		"no proof on the claim": {bl: claim(func(bl *buildlockv1.BuildLock) { delete(bl.Annotations, buildlockv1.RunProofAnnotation) })},
		"another name":          {bl: claim(func(bl *buildlockv1.BuildLock) { bl.Name = "other" })},
		"a proof whose process died before it learned the UID": {bl: claim(func(*buildlockv1.BuildLock) {}), want: true,
			proof: func() *proof { q := *p; q.state.UID = ""; return &q }},
		"a proof without a secret proves nothing, even an empty hash": {
			bl:    claim(func(bl *buildlockv1.BuildLock) { bl.Annotations[buildlockv1.RunProofAnnotation] = proofAnnotation("") }),
			proof: func() *proof { return &proof{state: proofState{Name: "acme-shop-main-42-staging"}} }},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			q := p
			if tc.proof != nil {
				q = tc.proof()
			}
			if got := q.proves(tc.bl); got != tc.want {
				t.Errorf("proves() = %v, want %v", got, tc.want)
			}
		})
	}
	if a, b := p.annotation(), (&proof{state: proofState{Nonce: strings.Repeat("0", 64)}}).annotation(); a == b || !strings.HasPrefix(a, "sha256:") || len(a) != len("sha256:")+64 {
		t.Errorf("annotations %q and %q", a, b)
	}
}

// TestTheProofFileIsHeldByOneProcessAtATime: while one process holds a
// claim's proof, another (of the same run id and directory) cannot open it
// and is told who holds it; once it is closed its content is there for the
// next process, and each run id and claim has a file of its own.
func TestTheProofFileIsHeldByOneProcessAtATime(t *testing.T) {
	c := Claim{Namespace: "ci", Target: "staging", Repo: "acme/shop", Branch: "main", Build: 42, RunID: "1-1", StateDir: t.TempDir()}
	first, err := openProof(c)
	must(t, err)
	first.renew("acme-shop-main-42-staging")
	first.state.UID = "uid-1"
	must(t, first.save())

	_, err = openProof(c)
	var busy *errProofBusy
	if !errors.As(err, &busy) || busy.pid != os.Getpid() {
		t.Fatalf("a second open: %v, want errProofBusy naming this process", err)
	}
	other := c
	other.RunID = "1-2"
	if p, err := openProof(other); err != nil || p.path == first.path || p.state.Nonce != "" {
		t.Errorf("another run's proof: %+v, %v; want a file of its own, empty", p, err)
	}

	first.close()
	again, err := openProof(c)
	must(t, err)
	if again.state.Nonce != first.state.Nonce || again.state.UID != "uid-1" || again.state.HandedOver {
		t.Errorf("reopened %+v, want what the first process saved", again.state)
	}
	must(t, again.handOver())
	s, err := readProof(again.path)
	if err != nil || !s.HandedOver || s.Nonce != first.state.Nonce {
		t.Errorf("after handOver: %+v, %v", s, err)
	}
	third, err := openProof(c)
	must(t, err)
	third.remove()
	if _, err := os.Stat(third.path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the removed proof is still there: %v", err)
	}
	if p, err := openProof(Claim{}); err != nil || p.file != nil || p.save() != nil {
		t.Errorf("without a state directory: %+v, %v; want a proof in memory", p, err)
	}
}

// TestAProofIsFreedWhenItsProcessIsKilled: the lock on a proof file is the
// kernel's (flock), so that a process killed with SIGKILL leaves it free
// for its restart.
func TestAProofIsFreedWhenItsProcessIsKilled(t *testing.T) {
	if os.Getenv("PROOF_HOLDER") != "" {
		c := Claim{Namespace: "ci", Target: "staging", Repo: "acme/shop", Branch: "main", Build: 42, RunID: "1-1", StateDir: os.Getenv("PROOF_HOLDER")}
		p, err := openProof(c)
		if err != nil {
			os.Exit(3)
		}
		p.renew("x")
		_ = p.save()
		os.Stdout.WriteString("locked\n")
		time.Sleep(time.Hour)
	}
	dir := t.TempDir()
	holder := exec.Command(os.Args[0], "-test.run", "^TestAProofIsFreedWhenItsProcessIsKilled$")
	holder.Env = append(os.Environ(), "PROOF_HOLDER="+dir)
	out, err := holder.StdoutPipe()
	must(t, err)
	must(t, holder.Start())
	buf := make([]byte, 7)
	if _, err := out.Read(buf); err != nil || string(buf) != "locked\n" {
		t.Fatalf("the holder did not lock its proof: %q, %v", buf, err)
	}
	c := Claim{Namespace: "ci", Target: "staging", Repo: "acme/shop", Branch: "main", Build: 42, RunID: "1-1", StateDir: dir}
	if _, err := openProof(c); !errors.As(err, new(*errProofBusy)) {
		t.Fatalf("while the holder runs: %v, want errProofBusy", err)
	}
	must(t, holder.Process.Kill())
	_ = holder.Wait()
	p, err := openProof(c)
	must(t, err)
	if p.state.Name != "x" || p.state.UID != types.UID("") {
		t.Errorf("the restart reads %+v, want the killed process's proof", p.state)
	}
	p.close()
}
