package opensandbox

// MaxFrame is the bound of one line of a command stream.
const MaxFrame = maxFrame

// SetFrameCap bounds the lines of p's command streams at n bytes instead
// of MaxFrame, before p runs a command: a test cuts a line longer than a
// frame without sending 16 MiB of it.
func SetFrameCap(p *Provider, n int) { p.frameCap = n }
