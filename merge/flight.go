package merge

import (
	"context"
	"errors"
	"io"
	"sync"
	"sync/atomic"

	"github.com/mlxserving/mlxserving/api"
)

// flight is one generation shared by its subscribers. It has no goroutine
// of its own: a subscriber that has read every chunk so far pulls the next
// one from the source (one at a time, under the flight's context) and
// appends it to chunks, where the others read at their own pace, from the
// start. The generation itself runs in the batcher whether or not anyone
// is reading.
type flight struct {
	m      *Merger
	key    Key
	src    api.Source
	ctx    context.Context // the generation's: ends when the last subscriber leaves
	cancel context.CancelFunc

	mu       sync.Mutex
	chunks   []api.Chunk
	pulling  bool  // a subscriber is reading the source
	done     bool  // the source ended; err says how
	err      error // nil: ended with its final chunk
	leaving  bool  // the last subscriber left; no one may join
	subs     int
	tier     api.Tier
	cacheIt  bool
	notify   chan struct{} // closed and replaced when chunks grow or done is set, if waited on
	waited   bool          // a reader holds notify
	stopOnce sync.Once
}

// join adds a subscriber, raising the generation's tier if the new one is
// more urgent. It returns nil if the flight is being abandoned or failed.
func (f *flight) join(ctx context.Context, tier api.Tier, useCache bool) *subscriber {
	f.mu.Lock()
	if f.leaving || (f.done && f.err != nil) {
		f.mu.Unlock()
		return nil
	}
	f.subs++
	f.cacheIt = f.cacheIt || useCache
	raise := tier.Outranks(f.tier)
	if raise {
		f.tier = tier
	}
	f.mu.Unlock()
	if r, ok := f.src.(Raiser); ok && raise {
		r.Raise(tier)
	}
	s := &subscriber{f: f}
	s.stopAfter = context.AfterFunc(ctx, func() { s.Close(context.Cause(ctx)) })
	return s
}

// leave drops a subscriber; the last one out stops the generation.
func (f *flight) leave(err error) {
	f.mu.Lock()
	f.subs--
	last := f.subs == 0 && !f.done
	if last {
		f.leaving = true
	}
	f.mu.Unlock()
	if last {
		f.m.forget(f)
		f.stop(err)
	}
}

// stop ends the generation: the source is closed with err and the
// flight's context cancelled, so a pull in progress returns.
func (f *flight) stop(err error) {
	if err == nil {
		err = context.Canceled // the generation finished; nothing waits
	}
	f.stopOnce.Do(func() {
		f.src.Close(err)
		f.cancel()
	})
}

// pull reads the source's next chunk for every subscriber. The caller set
// f.pulling.
func (f *flight) pull() {
	c, err := f.src.Recv(f.ctx)
	if err == nil {
		f.mu.Lock()
		f.chunks = append(f.chunks, c)
		f.pulling = false
		f.wakeLocked()
		f.mu.Unlock()
		return
	}
	if errors.Is(err, io.EOF) {
		err = nil
	} else if f.m.ctx.Err() != nil {
		err = ErrClosed
	}
	f.end(err)
}

// end records how the generation ended and wakes every subscriber. A
// finished generation one of whose subscribers asked is cached first, so
// a request that follows its end finds it.
func (f *flight) end(err error) {
	if err == nil && f.m.cache != nil {
		f.mu.Lock()
		cacheIt, chunks := f.cacheIt, f.chunks // the puller, our caller, is the only writer
		f.mu.Unlock()
		if cacheIt {
			f.m.cache.add(f.key, chunks)
			if f.m.shared != nil {
				f.m.sharedSet(f.key, chunks)
			}
		}
	}
	f.m.forget(f)
	f.stop(err)
	f.mu.Lock()
	f.done, f.err, f.pulling = true, err, false
	f.wakeLocked()
	f.mu.Unlock()
}

// wakeLocked wakes the readers waiting for news. Has to be called with
// f.mu held.
func (f *flight) wakeLocked() {
	if f.waited {
		close(f.notify)
		f.notify, f.waited = make(chan struct{}), false
	}
}

// subscriber is one request's view of a flight: an api.Source that reads
// the flight's chunks from the first.
type subscriber struct {
	f         *flight
	next      int
	stopAfter func() bool
	closeOnce sync.Once
	closed    atomic.Pointer[error] // why it left, once it has
}

// Recv returns the next chunk: one already produced, or the next one the
// generation produces. See api.Source. A subscriber that leaves (ctx ends,
// Close) while it is pulling the generation's next chunk for everyone
// returns once that chunk arrives.
func (s *subscriber) Recv(ctx context.Context) (api.Chunk, error) {
	f := s.f
	for {
		if err := s.closed.Load(); err != nil {
			return api.Chunk{}, *err
		}
		if err := ctx.Err(); err != nil {
			s.Close(context.Cause(ctx))
			return api.Chunk{}, err
		}
		f.mu.Lock()
		if s.next < len(f.chunks) {
			c := f.chunks[s.next]
			s.next++
			f.mu.Unlock()
			if c.Usage != nil { // each subscriber gets its own copy
				u := *c.Usage
				c.Usage = &u
			}
			return c, nil
		}
		if f.done {
			err := f.err
			f.mu.Unlock()
			s.release()
			if err == nil {
				return api.Chunk{}, io.EOF
			}
			return api.Chunk{}, err
		}
		if !f.pulling {
			f.pulling = true
			f.mu.Unlock()
			f.pull()
			continue
		}
		wait := f.notify
		f.waited = true
		f.mu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			s.Close(context.Cause(ctx))
			return api.Chunk{}, ctx.Err()
		}
	}
}

// Close leaves the generation; the last subscriber to leave stops it.
func (s *subscriber) Close(err error) {
	s.closeOnce.Do(func() {
		if err == nil {
			err = context.Canceled
		}
		s.closed.Store(&err)
		s.stopAfter()
		s.f.leave(err)
	})
}

// release leaves a generation that has ended, without stopping anything.
func (s *subscriber) release() {
	s.closeOnce.Do(func() {
		s.stopAfter()
		s.f.mu.Lock()
		s.f.subs--
		s.f.mu.Unlock()
	})
}
