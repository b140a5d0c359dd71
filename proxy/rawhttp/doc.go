// Package rawhttp is HTTP/1.1 in bytes, as the event loops' serving path
// (the lane) reads and writes it on raw sockets, without a server's or a
// client's request object: a client request's head scanned in one pass
// for what the lane needs of it, the head of each leg to an engine and of
// the client's answer written in one pass, and an engine's answer read
// from the reads it comes in, head and body, under the same bounds and
// with the same verdicts as the fasthttp path's reader
// (upstream.ReadAnswer).
//
// Heads are fasthttp's parsed headers, parsed with key normalizing off:
// no header object is copied, and no key is normalized or looked up more
// than once (a leg's head, built as the fasthttp path builds it, costs the
// lane about as much as the rest of a request's work). The package does
// no I/O and decides nothing about a request: which requests the lane
// serves, and where their legs go, are the caller's.
package rawhttp
