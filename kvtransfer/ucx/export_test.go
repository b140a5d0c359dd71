//go:build ucx

package ucx

// LocalTLS is localTLS, for the external tests.
var LocalTLS = localTLS
