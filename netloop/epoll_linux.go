//go:build linux

package netloop

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// Group is a set of loops that share the connections out between them.
type Group struct {
	loops []*Loop
	next  atomic.Uint32
	wg    sync.WaitGroup
	once  sync.Once
}

// NewGroup starts n loops (at least one).
func NewGroup(n int) (*Group, error) {
	g := &Group{}
	for range max(n, 1) {
		l, err := newLoop()
		if err != nil {
			g.Close()
			return nil, err
		}
		g.loops = append(g.loops, l)
		g.wg.Go(l.run)
	}
	return g, nil
}

// Pick returns the next loop, round robin.
func (g *Group) Pick() *Loop {
	return g.loops[int(g.next.Add(1))%len(g.loops)]
}

// Loops returns the group's loops.
func (g *Group) Loops() []*Loop { return g.loops }

// Close stops every loop: each handler still registered is told Shutdown
// (on its loop's goroutine) and removed. Close waits for the loops to end;
// it may be called more than once.
func (g *Group) Close() {
	g.once.Do(func() {
		for _, l := range g.loops {
			l.close()
		}
	})
	g.wg.Wait()
}

// Loop is one event loop: a goroutine waiting on an epoll set.
type Loop struct {
	epfd int
	wake int // eventfd that interrupts the wait

	mu       sync.Mutex
	handlers map[int]entry
	gen      uint32
	closed   bool
	posted   []func() // to run on the loop's goroutine (Post)

	in, out []byte // Buffers
}

// entry is a registered descriptor. gen tells its events from those of an
// earlier descriptor with the same number, still in a batch being handled
// when that one was removed and closed.
type entry struct {
	h   Handler
	gen uint32
}

// bufferSize is the size of each of the loop's shared buffers: a read
// takes up to this much (SSE events are small; more waiting is read on the
// next wake-up), and output past it grows a buffer for that call only.
const bufferSize = 16 << 10

func newLoop() (*Loop, error) {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("netloop: epoll_create1: %w", err)
	}
	if err := unix.SetNonblock(epfd, true); err != nil {
		_ = unix.Close(epfd)
		return nil, fmt.Errorf("netloop: epoll fd: %w", err)
	}
	wake, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		_ = unix.Close(epfd)
		return nil, fmt.Errorf("netloop: eventfd: %w", err)
	}
	ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(wake)}
	if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, wake, &ev); err != nil {
		_ = unix.Close(epfd)
		_ = unix.Close(wake)
		return nil, fmt.Errorf("netloop: epoll_ctl: %w", err)
	}
	return &Loop{epfd: epfd, wake: wake, handlers: make(map[int]entry),
		in: make([]byte, bufferSize), out: make([]byte, 0, bufferSize)}, nil
}

// Buffers are two buffers the handlers of this loop share, one to read
// into and one to build output in: usable only on the loop's goroutine,
// until the handler returns.
func (l *Loop) Buffers() (in, out []byte) { return l.in, l.out[:0] }

func epollEvents(ev Events) uint32 {
	e := uint32(unix.EPOLLRDHUP)
	if ev&Readable != 0 {
		e |= unix.EPOLLIN
	}
	if ev&Writable != 0 {
		e |= unix.EPOLLOUT
	}
	return e
}

// Add watches fd for ev (level-triggered) and tells h.
func (l *Loop) Add(fd int, ev Events, h Handler) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return ErrClosed
	}
	if _, ok := l.handlers[fd]; ok {
		return fmt.Errorf("netloop: fd %d already watched", fd)
	}
	l.gen++
	e := unix.EpollEvent{Events: epollEvents(ev), Fd: int32(fd), Pad: int32(l.gen)}
	if err := rawEpollCtl(l.epfd, unix.EPOLL_CTL_ADD, fd, &e); err != nil {
		return fmt.Errorf("netloop: watch fd %d: %w", fd, err)
	}
	l.handlers[fd] = entry{h: h, gen: l.gen}
	return nil
}

// Modify changes the events fd is watched for.
func (l *Loop) Modify(fd int, ev Events) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	en, ok := l.handlers[fd]
	if !ok {
		return fmt.Errorf("netloop: fd %d not watched", fd)
	}
	e := unix.EpollEvent{Events: epollEvents(ev), Fd: int32(fd), Pad: int32(en.gen)}
	if err := rawEpollCtl(l.epfd, unix.EPOLL_CTL_MOD, fd, &e); err != nil {
		return fmt.Errorf("netloop: modify fd %d: %w", fd, err)
	}
	return nil
}

// Remove stops watching fd; no event of it is delivered after Remove
// returns (called from the loop's goroutine) and the caller may use or
// close its connection again.
func (l *Loop) Remove(fd int) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.handlers[fd]; !ok {
		return nil
	}
	delete(l.handlers, fd)
	if err := rawEpollCtl(l.epfd, unix.EPOLL_CTL_DEL, fd, nil); err != nil && !errors.Is(err, unix.EBADF) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("netloop: unwatch fd %d: %w", fd, err)
	}
	return nil
}

// Len is the number of descriptors watched.
func (l *Loop) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.handlers)
}

func (l *Loop) close() {
	l.mu.Lock()
	l.closed = true
	l.mu.Unlock()
	l.interrupt()
}

// Post runs f on the loop's goroutine, after the events it is handling,
// as handlers run: so that what happens off the loop (a dial that ended, a
// timer that fired) may use the loop's state and Buffers. It reports false,
// and f does not run, once the loop is closed.
func (l *Loop) Post(f func()) bool {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return false
	}
	l.posted = append(l.posted, f)
	first := len(l.posted) == 1
	l.mu.Unlock()
	if first { // later ones find the loop woken already
		l.interrupt()
	}
	return true
}

// interrupt makes the loop's wait return.
func (l *Loop) interrupt() {
	var one = [8]byte{1}
	_, _ = unix.Write(l.wake, one[:])
}

// wakeUp handles the wake descriptor: the functions posted run, then a
// closed loop shuts down. It reports whether the loop is to end.
func (l *Loop) wakeUp() bool {
	var b [8]byte
	_, _ = rawRead(l.wake, b[:]) // resets the counter: the descriptor is watched level-triggered
	l.mu.Lock()
	posted, closed := l.posted, l.closed
	l.posted = nil
	l.mu.Unlock()
	for _, f := range posted {
		f()
	}
	if closed {
		l.shutdown()
	}
	return closed
}

func (l *Loop) lookup(fd int, gen uint32) (Handler, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	en, ok := l.handlers[fd]
	if !ok || en.gen != gen {
		return nil, false
	}
	return en.h, true
}

// run waits for events the way a goroutine waits on a socket: the epoll
// descriptor itself is watched by Go's network poller, so a loop with
// nothing to do is a parked goroutine, not a thread blocked in epoll_wait
// (which the runtime would have to work around: its processor handed to
// another thread, and taken back on every wake-up).
func (l *Loop) run() {
	f := os.NewFile(uintptr(l.epfd), "epoll")
	defer func() {
		_ = f.Close()
		_ = unix.Close(l.wake)
	}()
	rc, err := f.SyscallConn()
	if err != nil {
		panic(fmt.Sprintf("netloop: epoll descriptor: %v", err)) // NewFile of a valid fd: a bug
	}
	events := make([]unix.EpollEvent, 128)
	var n int
	wait := func(fd uintptr) bool {
		for {
			n, err = rawEpollPoll(int(fd), events)
			if !errors.Is(err, unix.EINTR) {
				return n > 0 || err != nil
			}
		}
	}
	for {
		if rerr := rc.Read(wait); rerr != nil {
			panic(fmt.Sprintf("netloop: wait: %v", rerr))
		}
		if err != nil {
			panic(fmt.Sprintf("netloop: epoll_wait: %v", err)) // a bad epoll fd: a bug
		}
		for i := range n {
			e := &events[i]
			fd := int(e.Fd)
			if fd == l.wake {
				if l.wakeUp() {
					return
				}
				continue
			}
			h, ok := l.lookup(fd, uint32(e.Pad))
			if !ok {
				continue
			}
			var ev Events
			if e.Events&(unix.EPOLLIN) != 0 {
				ev |= Readable
			}
			if e.Events&unix.EPOLLOUT != 0 {
				ev |= Writable
			}
			if e.Events&(unix.EPOLLHUP|unix.EPOLLRDHUP|unix.EPOLLERR) != 0 {
				ev |= HangUp
			}
			h.Ready(fd, ev)
		}
	}
}

// shutdown tells every handler still registered.
func (l *Loop) shutdown() {
	for {
		l.mu.Lock()
		var fd int
		var h Handler
		for f, en := range l.handlers {
			fd, h = f, en.h
			break
		}
		l.mu.Unlock()
		if h == nil {
			return
		}
		h.Ready(fd, Shutdown)
		_ = l.Remove(fd) // in case the handler did not
	}
}

// Read reads from fd without blocking: ErrWouldBlock when nothing is
// there; 0, nil at the end of the stream.
func Read(fd int, p []byte) (int, error) {
	for {
		n, err := rawRead(fd, p)
		switch {
		case err == nil:
			return n, nil
		case errors.Is(err, unix.EINTR):
			continue
		case errors.Is(err, unix.EAGAIN):
			return 0, ErrWouldBlock
		}
		return 0, err
	}
}

// Write writes p to fd without blocking, as much as fits: n < len(p) with
// ErrWouldBlock when the socket's buffer is full.
func Write(fd int, p []byte) (int, error) {
	n, _, err := Write2(fd, p, nil)
	return n, err
}

// Write2 writes a then b to fd without blocking, as Write does, in one
// system call where the socket takes both (writev): a message's head and a
// body kept in a buffer of its own go out together, the body not copied
// behind the head. It returns how much of a and of b was written.
func Write2(fd int, a, b []byte) (na, nb int, err error) {
	for na < len(a) || nb < len(b) {
		n, err := rawWritev(fd, a[na:], b[nb:])
		if n > 0 {
			da := min(n, len(a)-na)
			na += da
			nb += n - da
		}
		switch {
		case err == nil:
			continue
		case errors.Is(err, unix.EINTR):
			continue
		case errors.Is(err, unix.EAGAIN):
			return na, nb, ErrWouldBlock
		}
		return na, nb, err
	}
	return na, nb, nil
}

// SetReadLowWater makes fd readable to its loop only once n bytes are
// waiting (SO_RCVLOWAT; the kernel caps n at half its largest receive
// buffer, and reports readable before n when that buffer is under
// pressure, so a reader is never stranded), or the peer closed. A handler
// expecting a body of known length is woken once for it, not once per
// segment. It must be set back to 1 before the connection is read any
// other way: a Go net.Conn's reads wait on the same readiness.
func SetReadLowWater(fd, n int) error {
	return rawSetRcvLowat(fd, max(n, 1))
}
