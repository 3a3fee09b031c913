package scheduler

// entryHeap is a binary min-heap of entries that keeps each entry's
// position up to date through pos, so any entry can be removed in
// O(log n). It is not safe for concurrent use; the scheduler's lock
// guards it.
type entryHeap[T any] struct {
	items []*Entry[T]
	less  func(a, b *Entry[T]) bool
	pos   func(e *Entry[T]) *int
}

func (h *entryHeap[T]) len() int { return len(h.items) }

// top returns the least entry, or nil when the heap is empty.
func (h *entryHeap[T]) top() *Entry[T] {
	if len(h.items) == 0 {
		return nil
	}
	return h.items[0]
}

func (h *entryHeap[T]) push(e *Entry[T]) {
	*h.pos(e) = len(h.items)
	h.items = append(h.items, e)
	h.up(len(h.items) - 1)
}

// remove takes e out of the heap; e must be in it.
func (h *entryHeap[T]) remove(e *Entry[T]) {
	i := *h.pos(e)
	last := len(h.items) - 1
	if i != last {
		h.swap(i, last)
	}
	h.items[last] = nil
	h.items = h.items[:last]
	*h.pos(e) = -1
	if i != last && !h.down(i) {
		h.up(i)
	}
}

func (h *entryHeap[T]) swap(i, j int) {
	h.items[i], h.items[j] = h.items[j], h.items[i]
	*h.pos(h.items[i]) = i
	*h.pos(h.items[j]) = j
}

func (h *entryHeap[T]) up(i int) {
	for i > 0 {
		parent := (i - 1) / 2
		if !h.less(h.items[i], h.items[parent]) {
			return
		}
		h.swap(i, parent)
		i = parent
	}
}

// down sifts item i down and reports whether it moved.
func (h *entryHeap[T]) down(i int) bool {
	start, n := i, len(h.items)
	for {
		child := 2*i + 1
		if child >= n {
			break
		}
		if r := child + 1; r < n && h.less(h.items[r], h.items[child]) {
			child = r
		}
		if !h.less(h.items[child], h.items[i]) {
			break
		}
		h.swap(i, child)
		i = child
	}
	return i > start
}
