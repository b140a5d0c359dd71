// Package clientconn is the client side of the sidecar's connections, as
// fasthttp's path and the lane's event loops share them: the wrapper of an
// accepted TCP connection (Conn), which moves between fasthttp and the
// loops and counts the bytes of its requests so that nothing read ahead is
// lost when it moves.
//
// A Listener accepts Conns. fasthttp's handler counts each request it
// serves (Counted); a Conn whose next request fasthttp reads goes to its
// Adopter (the lane), and one an Adopter gives to fasthttp carries the
// bytes it read (Replay). A stream may take a Conn over mid-answer
// (HandOff) when fasthttp holds nothing unread (Synced). After an error
// answer a Conn closes lingering (Linger).
//
// The package decides nothing about a request: which requests the
// Adopter serves, and what a client that left means for one, are the
// caller's.
package clientconn
