package p

import "testing"

func TestClamp(t *testing.T) {
	for _, c := range [][3]int{{-1, 5, 0}, {3, 5, 3}, {9, 5, 5}} {
		if got := Clamp(c[0], c[1]); got != c[2] {
			t.Errorf("Clamp(%d, %d) = %d, want %d", c[0], c[1], got, c[2])
		}
	}
}

func TestMid(t *testing.T) {
	if got := Mid(2, 6); got != 4 {
		t.Errorf("Mid(2, 6) = %d", got)
	}
}

func TestCount(t *testing.T) {
	if got := Count([]int{1, 2}, false); got != -2 {
		t.Errorf("Count = %d", got)
	}
}

func TestName(t *testing.T) {
	if Name("x") != "p-x" {
		t.Error(Name("x"))
	}
}
