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
