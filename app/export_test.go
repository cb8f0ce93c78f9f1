package app

// Keys lists every configuration key's dotted path.
func Keys() []string {
	var out []string
	for _, l := range leaves() {
		out = append(out, l.path)
	}
	return out
}

// KeyUsage is a key's line in -h.
func KeyUsage(key string) string { return keyUsage()[key] }

// WithBeforeServe returns d whose server runs f on its serving goroutine
// before Serve.
func WithBeforeServe(d Deps, f func()) Deps {
	d.beforeServe = f
	return d
}
