package v1alpha1

import (
	"encoding/json"
	"fmt"
	"time"
)

// Timestamp is an instant that a person or a CI system writes into a spec:
// any RFC 3339 date-time, with or without a fraction of a second, in UTC
// ("Z") or with an offset ("+14:00"). The API server refuses anything else
// at admission; everything it admits decodes (unlike metav1.MicroTime, which
// decodes only exactly six fractional digits, so that one claim written by
// hand used to stop the operator's informer for every claim in the
// cluster). It is written back in UTC with microseconds, like MicroTime.
//
// +kubebuilder:object:generate=false
// +kubebuilder:validation:Type=string
// +kubebuilder:validation:MaxLength=35
// +kubebuilder:validation:XValidation:rule=`self.matches(r'^[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,9})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])$') && timestamp(self) >= timestamp('0001-01-01T00:00:00Z')`,message="must be an RFC 3339 time such as 2026-11-30T22:45:00Z: date, upper-case T, time, an optional fraction of a second, and Z or an offset such as +02:00"
type Timestamp struct {
	time.Time `json:"-"`
}

// timestampLayout is how a Timestamp is written: MicroTime's layout, so
// that what the operator's clients write reads the same as before.
const timestampLayout = "2006-01-02T15:04:05.000000Z07:00"

// NewTimestamp returns a Timestamp for t.
func NewTimestamp(t time.Time) *Timestamp {
	return &Timestamp{Time: t}
}

// ParseTimestamp parses an RFC 3339 date-time, as the API accepts it.
func ParseTimestamp(s string) (Timestamp, error) {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return Timestamp{}, fmt.Errorf("parsing %q as an RFC 3339 time (for example 2026-11-30T22:45:00Z): %w", s, err)
	}
	return Timestamp{Time: t}, nil
}

// UnmarshalJSON accepts null and any RFC 3339 date-time.
func (t *Timestamp) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		t.Time = time.Time{}
		return nil
	}
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("a timestamp must be a string: %w", err)
	}
	parsed, err := ParseTimestamp(s)
	if err != nil {
		return err
	}
	*t = parsed
	return nil
}

// MarshalJSON writes the instant in UTC with microseconds, or null.
func (t Timestamp) MarshalJSON() ([]byte, error) {
	if t.IsZero() {
		return []byte("null"), nil
	}
	return json.Marshal(t.UTC().Format(timestampLayout))
}

// ToUnstructured returns the instant as it is written in JSON, for the
// unstructured converter.
func (t Timestamp) ToUnstructured() any {
	if t.IsZero() {
		return nil
	}
	return t.UTC().Format(timestampLayout)
}

// DeepCopyInto copies the instant; time.Time is a value.
func (t *Timestamp) DeepCopyInto(out *Timestamp) {
	*out = *t
}

// DeepCopy returns a copy of t.
func (t *Timestamp) DeepCopy() *Timestamp {
	if t == nil {
		return nil
	}
	out := new(Timestamp)
	t.DeepCopyInto(out)
	return out
}
