package inference

import "context"

// Step is a blocking call a request needs before it goes on (a bootstrap
// server's answer, ...), which both drivers run the same way: fasthttp's
// on the request's goroutine, the lane on a goroutine of its own, off the
// loop. The call touches nothing of the request but what the step took
// when it was made; the func it returns goes on with its outcome, on the
// request's goroutine or its loop, and is not run when the request ended
// meanwhile (its context's end makes the call return).
type Step func(ctx context.Context) (then func())
