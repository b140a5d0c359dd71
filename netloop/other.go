//go:build !linux

package netloop

// Group is a set of event loops; not available on this platform.
type Group struct{}

// NewGroup returns ErrUnsupported on this platform.
func NewGroup(int) (*Group, error) { return nil, ErrUnsupported }

// Pick is never called: there is no Group.
func (g *Group) Pick() *Loop { return nil }

// Close does nothing.
func (g *Group) Close() {}

// Loops returns nothing.
func (g *Group) Loops() []*Loop { return nil }

// Loop is one event loop; not available on this platform.
type Loop struct{}

// Buffers returns nils.
func (l *Loop) Buffers() (in, out []byte) { return nil, nil }

// Add returns ErrUnsupported.
func (l *Loop) Add(int, Events, Handler) error { return ErrUnsupported }

// Modify returns ErrUnsupported.
func (l *Loop) Modify(int, Events) error { return ErrUnsupported }

// Post returns false: f never runs.
func (l *Loop) Post(func()) bool { return false }

// Remove does nothing.
func (l *Loop) Remove(int) error { return nil }

// Len returns 0.
func (l *Loop) Len() int { return 0 }

// Read returns ErrUnsupported.
func Read(int, []byte) (int, error) { return 0, ErrUnsupported }

// Write returns ErrUnsupported.
func Write(int, []byte) (int, error) { return 0, ErrUnsupported }

// Write2 returns ErrUnsupported.
func Write2(int, []byte, []byte) (int, int, error) { return 0, 0, ErrUnsupported }

// SetReadLowWater returns ErrUnsupported.
func SetReadLowWater(int, int) error { return ErrUnsupported }
