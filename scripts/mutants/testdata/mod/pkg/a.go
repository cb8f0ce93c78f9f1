package pkg

func grow(n int) []int {
	s := make([]int, 0, n+1)
	if n > 3 {
		s = append(s, n)
	}
	return s
}

const limit = 2 * 3

func kind(n int) string {
	switch {
	case n > limit:
		return "big"
	}
	return "small"
}
