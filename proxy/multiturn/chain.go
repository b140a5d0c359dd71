package multiturn

// links are a node's place in one of the store's lists.
type links[T any] struct{ prev, next *T }

// chain is a doubly linked list of T, oldest first, linked through the
// links that at gives of each node, so that a node is on several lists
// (every entry, its client's) with no allocation of the lists' own.
type chain[T any] struct{ first, last *T }

// push puts n last.
func (c *chain[T]) push(n *T, at func(*T) *links[T]) {
	l := at(n)
	l.prev, l.next = c.last, nil
	if c.last != nil {
		at(c.last).next = n
	} else {
		c.first = n
	}
	c.last = n
}

// remove takes n off the list.
func (c *chain[T]) remove(n *T, at func(*T) *links[T]) {
	l := at(n)
	if l.prev != nil {
		at(l.prev).next = l.next
	} else {
		c.first = l.next
	}
	if l.next != nil {
		at(l.next).prev = l.prev
	} else {
		c.last = l.prev
	}
	l.prev, l.next = nil, nil
}

// The lists' links: every entry's place among all, and among its client's;
// a client's among those over their share.
func everyEntry(st *stored) *links[stored]  { return &st.every }
func clientEntry(st *stored) *links[stored] { return &st.mine }
func overShare(c *client) *links[client]    { return &c.overLinks }
