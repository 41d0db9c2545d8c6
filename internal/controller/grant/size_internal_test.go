package grant

import (
	"strings"
	"testing"
	"time"

	"github.com/buildlock/buildlock/internal/arbiter"
)

// TestALineRecordTakesNoMoreThanItsSize: the line memory's budgets count
// arbiter.LineRecord.Size, so every record must be written in no more
// bytes than that, its start (issue 31) included.
func TestALineRecordTakesNoMoreThanItsSize(t *testing.T) {
	at := time.Date(2026, 12, 31, 23, 59, 59, 999999999, time.FixedZone("", 3600))
	encode := func(r arbiter.LineRecord) string {
		s, err := encodeUnescaped([]lineRecord{{Repo: r.Repo, Branch: r.Branch, Workflow: r.Workflow, Build: r.Build,
			HeldAt: r.HeldAt.UTC(), Owner: r.Owner, OwnerCI: r.OwnerCI, Since: r.Since.UTC(), Token: r.Token, Started: r.Started.UTC()}})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	// Each optional field's overhead covers what it adds.
	base := arbiter.LineRecord{Repo: "a/b", Branch: "m", Build: 1, HeldAt: at}
	for name, with := range map[string]func(r *arbiter.LineRecord){
		"since":   func(r *arbiter.LineRecord) { r.Since = at },
		"token":   func(r *arbiter.LineRecord) { r.Token = 9223372036854775807 },
		"started": func(r *arbiter.LineRecord) { r.Started = at },
		"ownerCI": func(r *arbiter.LineRecord) { r.OwnerCI = true },
	} {
		r := base
		with(&r)
		if added, counted := len(encode(r))-len(encode(base)), r.Size()-base.Size(); added > counted {
			t.Errorf("%s adds %d bytes, its overhead counts %d", name, added, counted)
		}
	}
	for name, r := range map[string]arbiter.LineRecord{
		"the smallest": {Repo: "a/b", Branch: "m", Build: 1, HeldAt: at},
		"the largest": {Repo: "acme/" + strings.Repeat("r", 250), Branch: strings.Repeat("\"\\<>&\u2028", 42),
			Workflow: strings.Repeat("\u00e9\"", 127), Build: 9007199254740991, HeldAt: at, Owner: strings.Repeat("<\"", 256),
			OwnerCI: true, Since: at, Token: 9223372036854775807, Started: at},
	} {
		s, err := encodeUnescaped([]lineRecord{{Repo: r.Repo, Branch: r.Branch, Workflow: r.Workflow, Build: r.Build,
			HeldAt: r.HeldAt.UTC(), Owner: r.Owner, OwnerCI: r.OwnerCI, Since: r.Since.UTC(), Token: r.Token, Started: r.Started.UTC()}})
		if err != nil {
			t.Fatal(err)
		}
		// One record between the array's brackets: the comma a record's
		// size counts takes the place of one of them.
		if got := len(s) - 1; got > r.Size() {
			t.Errorf("%s: written in %d bytes, its Size is %d", name, got, r.Size())
		}
	}
}
