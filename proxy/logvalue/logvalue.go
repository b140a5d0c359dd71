// Package logvalue cuts a value that came from outside (a client's header,
// a peer's address) to a length fit for a log line or an error message, so
// that no peer can fill the sidecar's logs with one request. Every package
// of the proxy quotes such values through it, so they are cut alike.
package logvalue

// Max is the most bytes of a value quoted.
const Max = 256

// Cut returns s, or its first Max bytes followed by "..." when it is
// longer.
func Cut(s string) string {
	if len(s) > Max {
		return s[:Max] + "..."
	}
	return s
}
