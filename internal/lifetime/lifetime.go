// Package lifetime holds the close-once step that gonixl's handles share: a handle guards its native state
// with a mutex and a closed flag, and its Close tears the state down once, under the write lock, so that
// Close is idempotent and never runs while an operation holds the lock.
package lifetime

import "sync"

// CloseOnce runs teardown with mu locked the first time it is called for closed, which it sets; later calls
// return nil without running teardown. closed must be guarded by mu.
func CloseOnce(mu sync.Locker, closed *bool, teardown func() error) error {
	mu.Lock()
	defer mu.Unlock()
	if *closed {
		return nil
	}
	*closed = true
	return teardown()
}

// Once is the same contract for a handle whose Close waits for work in flight and so cannot hold a lock
// that work takes (the connector's roles, the side-channel server): the first Close runs teardown and
// returns its error; every later or concurrent Close waits until that teardown has returned, then returns
// nil. The zero value is ready to use.
type Once struct{ once sync.Once }

// Close runs teardown the first time it is called and returns its error; later calls return nil once the
// first has finished.
func (o *Once) Close(teardown func() error) (err error) {
	o.once.Do(func() { err = teardown() })
	return err
}
