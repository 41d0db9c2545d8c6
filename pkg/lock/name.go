package lock

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// MaxNameLength bounds derived names. It is a DNS label's length, stricter
// than the 253 characters a BuildLock name may have, so that a name fits in a
// label value and stays readable in `kubectl get` tables.
const MaxNameLength = validation.DNS1123LabelMaxLength

// Name returns the BuildLock name of the claim: Claim.Name when set, else
// derived from the claim's identity as <repo>-<branch>-<build>-<target>,
// lower-cased, with every run of other characters than a-z and 0-9 turned
// into one '-'. The target is part of the name because one build may claim
// several targets (staging, then production) in one namespace. A name that
// would be longer than MaxNameLength keeps its build and target, shortens
// repo and branch, and ends in 8 hex digits of a hash of the identity, so
// that it stays unique: build 4711 of acme/frontend-monorepo on branch
// feature/payments-v2-with-a-very-long-name claiming staging is
// "acme-frontend-monorepo-feature-payments-v-4711-staging-dd60ef1d".
// The result is always a valid DNS label.
func Name(c Claim) string {
	if c.Name != "" {
		return c.Name
	}
	full := joinParts(sanitize(c.Repo), sanitize(c.Branch), buildPart(c.Build), sanitize(c.Target))
	if full != "" && len(full) <= MaxNameLength {
		return full
	}
	return compactName(c, identityHash(c.Target, c.Repo, c.Branch, strconv.FormatInt(c.Build, 10)))
}

// fallbackName is a name Acquire uses when Name(c) is taken by a claim that
// is not this job's (another build whose name sanitizes alike, another
// pod's claim of the build, or a claim created under it to keep this build
// out): Name(c), shortened to leave room, and 5 random characters (from
// generateName's alphabet, drawn from crypto/rand), so that nobody can
// take it beforehand. Acquire finds such a claim again through its proof
// (Claim.StateDir), not by deriving its name.
func fallbackName(c Claim) string {
	const suffixLength = 5
	const alphabet = "bcdfghjklmnpqrstvwxz2456789" // no vowels: no words
	base := Name(c)
	if len(base) > MaxNameLength-suffixLength-1 {
		base = strings.TrimRight(base[:MaxNameLength-suffixLength-1], "-")
	}
	b := make([]byte, suffixLength)
	_, _ = rand.Read(b) // crypto/rand.Read never fails
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	return base + "-" + string(b)
}

// compactName is <repo-branch, shortened>-<build>-<target, shortened>-<hash>,
// at most MaxNameLength long.
func compactName(c Claim, hash string) string {
	const maxTail = 30 // build (up to 19 digits) and target
	tail := joinParts(buildPart(c.Build), sanitize(c.Target))
	if len(tail) > maxTail {
		tail = strings.TrimRight(tail[:maxTail], "-")
	}
	headBudget := MaxNameLength - len(hash) - 1
	if tail != "" {
		headBudget -= len(tail) + 1
	}
	head := joinParts(sanitize(c.Repo), sanitize(c.Branch))
	if len(head) > headBudget {
		head = strings.TrimRight(head[:headBudget], "-")
	}
	if head == "" && tail == "" {
		head = "buildlock"
	}
	return joinParts(head, tail, hash)
}

// sanitize lower-cases s and turns every run of characters other than a-z
// and 0-9 into one '-', trimmed at both ends.
func sanitize(s string) string {
	return collapseRuns(strings.ToLower(s), func(r rune) bool {
		return ('a' <= r && r <= 'z') || ('0' <= r && r <= '9')
	})
}

// collapseRuns keeps the runes of s that keep accepts and turns every run of
// the others into one '-', never at the start or the end.
func collapseRuns(s string, keep func(rune) bool) string {
	var b strings.Builder
	dash := false
	for _, r := range s {
		if !keep(r) {
			dash = true
			continue
		}
		if dash && b.Len() > 0 {
			b.WriteByte('-')
		}
		dash = false
		b.WriteRune(r)
	}
	return b.String()
}

func buildPart(build int64) string {
	if build < 1 {
		return ""
	}
	return strconv.FormatInt(build, 10)
}

// joinParts joins the non-empty parts with '-'.
func joinParts(parts ...string) string {
	return joinNonEmpty("-", parts...)
}

// joinNonEmpty joins the non-empty parts with sep.
func joinNonEmpty(sep string, parts ...string) string {
	kept := parts[:0:0]
	for _, p := range parts {
		if p != "" {
			kept = append(kept, p)
		}
	}
	return strings.Join(kept, sep)
}

// identityHash is 8 hex digits of a SHA-256 over the fields, each ended by
// a NUL so that ("ab", "c") and ("a", "bc") differ.
func identityHash(fields ...string) string {
	h := sha256.New()
	for _, f := range fields {
		h.Write([]byte(f))
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil))[:8]
}
