package arbiter

import "testing"

// FuzzDecide decodes an input from the fuzzer's bytes (see genInput: one
// byte per choice) and checks every invariant of the package's rules. The
// seed corpus in testdata/fuzz/FuzzDecide holds the hand-offs, expiries and
// lost grants worth starting from.
func FuzzDecide(f *testing.F) {
	f.Add([]byte{})
	// Random inputs long enough to reach the orderings, the queue places,
	// the renewals and the grant record's memory (choices made last).
	r := seeded(7)
	for range 8 {
		data := make([]byte, 160)
		for k := range data {
			data[k] = byte(r.intn(256))
		}
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		ch := &byteChooser{data: data}
		in := withFreezes(ch, genInput(ch))
		if err := checkInvariants(in, in.decide()); err != nil {
			t.Fatalf("%v\n%s", err, describeInput(in))
		}
	})
}
