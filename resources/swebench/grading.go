package swebench

import "time"

// GradingTime is how long the reply's grading took (its
// patch_verification_time_taken); zero when no grading ran. The server
// binary records it in its metrics.
func (r VerifyResult) GradingTime() time.Duration {
	return time.Duration(r.PatchVerificationTimeTaken * float64(time.Second))
}
