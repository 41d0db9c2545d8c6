package lock

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"

	"k8s.io/apimachinery/pkg/types"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
)

// A run id says which run a claim belongs to, but two jobs can compute the
// same one (matrix jobs of one GitHub run, parallel Jenkins stages), and
// anyone may copy it. What proves that a claim is this job's is a secret
// that only the process that created it knows: a nonce, kept in a file of
// the job's own state directory (Claim.StateDir), whose SHA-256 the claim
// carries (buildlockv1.RunProofAnnotation). The process holds an exclusive
// lock on that file while it works on the claim, so that a second process
// of the same job (the same run id and directory) cannot take the claim
// while the first still runs; once it died, its restart can.

// proofState is what the proof file holds.
type proofState struct {
	// Nonce is the secret, hex; empty until a claim is created.
	Nonce string `json:"nonce,omitempty"`
	// Name and UID are the claim created with Nonce (UID once known).
	Name string    `json:"name,omitempty"`
	UID  types.UID `json:"uid,omitempty"`
	// HandedOver says the process that created the claim ended on purpose
	// while the claim held (acquire without a command printed the token):
	// the job's later steps use the hold, and no other acquire may take it.
	HandedOver bool `json:"handedOver,omitempty"`
	// PID is the process that last locked the file, for messages.
	PID int `json:"pid,omitempty"`
}

// proof is one claim's proof, in a file or (without a state directory) in
// memory only.
type proof struct {
	path  string   // empty: in memory only
	file  *os.File // open and locked while this process uses the claim
	state proofState
	// synced receives the result of the write's sync to disk that
	// writeSyncing started; nil when none is pending.
	synced chan error
}

// errProofBusy says another process holds the proof file: another acquire
// of the same run and job runs at this moment.
type errProofBusy struct {
	path string
	pid  int
}

func (e *errProofBusy) Error() string {
	who := "another process"
	if e.pid > 0 {
		who = "process " + strconv.Itoa(e.pid)
	}
	return fmt.Sprintf("%s holds %s", who, e.path)
}

// proofPath is where the proof of claim c is kept in dir: one file per
// namespace, target, build and run id (what ReleaseBuild knows of it).
func proofPath(dir string, c Claim) string {
	h := sha256.New()
	for _, f := range []string{c.Namespace, c.Target, c.Repo, c.Branch, strconv.FormatInt(c.Build, 10), c.RunID} {
		h.Write([]byte(f))
		h.Write([]byte{0})
	}
	return filepath.Join(dir, "buildlock-"+hex.EncodeToString(h.Sum(nil))[:16]+".proof")
}

// openProof opens and locks the proof of claim c in c.StateDir (in memory
// when it is empty). It fails with *errProofBusy when another process holds
// it.
func openProof(c Claim) (*proof, error) {
	if c.StateDir == "" {
		return &proof{}, nil
	}
	if err := os.MkdirAll(c.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("creating the state directory: %w", err)
	}
	p := &proof{path: proofPath(c.StateDir, c)}
	f, err := os.OpenFile(p.path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening the claim's proof: %w", err)
	}
	if err := lockFile(f); err != nil {
		_ = f.Close()
		if errors.Is(err, errLocked) {
			busy := &errProofBusy{path: p.path}
			if s, err := readProof(p.path); err == nil {
				busy.pid = s.PID
			}
			return nil, busy
		}
		return nil, fmt.Errorf("locking the claim's proof %s: %w", p.path, err)
	}
	p.file = f
	if s, err := readProofFile(f); err == nil {
		p.state = s // unreadable: a proof of nothing
	}
	p.state.PID = os.Getpid()
	return p, nil
}

// readProof reads the proof file at path without locking it.
func readProof(path string) (proofState, error) {
	f, err := os.Open(path)
	if err != nil {
		return proofState{}, err
	}
	defer f.Close()
	return readProofFile(f)
}

func readProofFile(f *os.File) (proofState, error) {
	var s proofState
	data, err := io.ReadAll(io.NewSectionReader(f, 0, 1<<16))
	if err != nil {
		return s, err
	}
	if len(data) == 0 {
		return s, nil
	}
	return s, json.Unmarshal(data, &s)
}

// renew draws a new secret, for a new claim named name.
func (p *proof) renew(name string) {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // crypto/rand.Read never fails
	p.state = proofState{Nonce: hex.EncodeToString(b), Name: name, PID: os.Getpid()}
}

// annotation is the value of buildlockv1.RunProofAnnotation for the secret.
func (p *proof) annotation() string {
	return proofAnnotation(p.state.Nonce)
}

func proofAnnotation(nonce string) string {
	sum := sha256.Sum256([]byte(nonce))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// proves reports whether bl is the claim this proof was made for: it carries
// the secret's hash, and its name and UID are the ones recorded.
func (p *proof) proves(bl *buildlockv1.BuildLock) bool {
	s := p.state
	return s.Nonce != "" && bl.Annotations[buildlockv1.RunProofAnnotation] == p.annotation() &&
		s.Name == bl.Name && (s.UID == "" || s.UID == bl.UID)
}

// save writes the proof to its file, in place (its lock is on the file
// itself), and syncs it to disk. A proof in memory only is not saved.
func (p *proof) save() error {
	if err := p.write(); err != nil {
		return err
	}
	return p.sync()
}

// writeSyncing writes the proof, and syncs it to disk on a goroutine of its
// own: flush returns the sync's result. The write is what lets a process of
// the job that comes after this one ends prove the claim: the kernel keeps
// it whatever becomes of this process. The sync, which can take tens of
// milliseconds on a busy disk, only guards against the machine itself
// failing, so it need not delay the claim's create: it overlaps the create
// and the wait for the grant, and Acquire waits for it before it returns a
// hold.
func (p *proof) writeSyncing() error {
	if err := p.write(); err != nil {
		return err
	}
	if p.file == nil {
		return nil
	}
	before := p.synced
	done := make(chan error, 1)
	p.synced = done
	go func() {
		err := p.sync()
		if before != nil {
			err = errors.Join(<-before, err)
		}
		done <- err
	}()
	return nil
}

// flush waits for the sync that writeSyncing started, and returns its
// error.
func (p *proof) flush() error {
	if p.synced == nil {
		return nil
	}
	err := <-p.synced
	p.synced = nil
	return err
}

func (p *proof) write() error {
	if p.file == nil {
		return nil
	}
	data, err := json.Marshal(p.state)
	if err != nil {
		return fmt.Errorf("encoding the claim's proof: %w", err)
	}
	if err := p.file.Truncate(0); err != nil {
		return fmt.Errorf("writing the claim's proof %s: %w", p.path, err)
	}
	if _, err := p.file.WriteAt(data, 0); err != nil {
		return fmt.Errorf("writing the claim's proof %s: %w", p.path, err)
	}
	return nil
}

func (p *proof) sync() error {
	if p.file == nil {
		return nil
	}
	if err := p.file.Sync(); err != nil {
		return fmt.Errorf("writing the claim's proof %s: %w", p.path, err)
	}
	return nil
}

// close unlocks the proof and keeps what it says: the claim stays this
// job's, for a later acquire or release of the job.
func (p *proof) close() {
	_ = p.flush()
	if p.file != nil {
		_ = p.file.Close()
		p.file = nil
	}
}

// handOver marks the claim as handed over to the job's later steps, then
// closes the proof.
func (p *proof) handOver() error {
	p.state.HandedOver = true
	err := p.save()
	p.close()
	return err
}

// remove deletes the proof: its claim is gone.
func (p *proof) remove() {
	if p.path != "" {
		_ = os.Remove(p.path)
	}
	p.close()
}
