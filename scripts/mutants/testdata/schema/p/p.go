// Package p is what TestSchemaRunsEachMutantWithTheTestsOfItsLine mutates:
// a mutant of each kind, killed, lived, not viable and not reached.
package p

// Clamp bounds n to [0, hi].
func Clamp(n, hi int) int {
	if n < 0 {
		return 0
	}
	if n > hi {
		return hi
	}
	return n
}

// Mid is halfway between a and b.
func Mid(a, b int) int { return a + (b-a)/2 }

// Count counts xs, down from 0 when neg.
func Count(xs []int, neg bool) int {
	c := 0
	for range xs {
		if neg == true {
			c--
		} else {
			c++
		}
	}
	return -c * 1
}

// Name is p's name for s.
func Name(s string) string { return "p-" + s }

// Unreached is reached by no test.
func Unreached(n int) int { return n % 3 }
