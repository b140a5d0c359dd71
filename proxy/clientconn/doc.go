// Package clientconn is the client side of the sidecar's connections, as
// fasthttp's path and the lane's event loops share them: the wrapper of an
// accepted TCP connection (Conn), which moves between fasthttp and the
// loops and counts the bytes of its requests so that nothing read ahead is
// lost when it moves; the ways to tell that a client left while its
// request waits (Watch, PeerClosed); and the checks of what the sidecar
// takes from a client's request head.
//
// A Listener accepts Conns. fasthttp's handler counts each request it
// serves (Counted); a Conn whose next request fasthttp reads goes to its
// Adopter (the lane), and one an Adopter gives to fasthttp carries the
// bytes it read (Replay). A stream may take a Conn over mid-answer
// (HandOff) when fasthttp holds nothing unread (Synced). After an error
// answer a Conn closes lingering (Linger).
//
// An Armer arms a Watch of a request's connection once the request has
// waited WatchDelay: a goroutine reads the connection, and a client that
// left cancels the request with the Armer's cause. PeerClosed peeks,
// without blocking, for a client that closed its side before an answer
// that came sooner.
//
// The head checks are pure: the fields of the head only, never a chunked
// body's trailer section (DropTrailers); each under a name that is an HTTP
// token (BadHeaderName); of a version the sidecar serves (ServedVersion);
// a target whose path is routed on as sent (NormalTarget), forwarded in
// origin form (OriginForm); and of a request that could not be parsed,
// only what holds none of its bytes (SafeParseError, LogSafe). What to
// answer to a request that fails one is the caller's.
//
// The package decides nothing about a request: which requests the
// Adopter serves, and what a client that left means for one, are the
// caller's.
package clientconn
