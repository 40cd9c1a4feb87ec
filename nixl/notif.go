package nixl

import (
	"context"
	"encoding/binary"
	"fmt"
	"time"

	"github.com/gonixl/gonixl/internal/poll"
)

// Notification is a message from a peer agent: a transfer's notification or one sent with
// SendNotification. Msg is arbitrary bytes (NULs allowed).
type Notification struct {
	Agent string
	Msg   []byte
}

// GetNotifications returns the notifications that arrived since the last call (NIXL keeps none once
// returned) and drives the backends' progress. Safe for concurrent use; concurrent callers each get
// different notifications.
func (a *Agent) GetNotifications(opts ...Option) ([]Notification, error) {
	op := "get notifications"
	o, end, err := a.useOpts(op, opts)
	if err != nil {
		return nil, err
	}
	defer end()
	a.notifMu.Lock()
	defer a.notifMu.Unlock()
	if a.notifMap == nil {
		m, st := cCreateNotifMap()
		if err := check(op, st, ""); err != nil {
			return nil, err
		}
		a.notifMap = m
	}
	raw, count, st := cGetNotifs(a.h, a.notifMap, o)
	if err := check(op, st, a.name); err != nil {
		return nil, err
	}
	if count == 0 {
		return nil, nil
	}
	return parseNotifs(raw, count)
}

// parseNotifs decodes gx_get_notifs' records: [u32 agent_len][agent][u32 msg_len][msg].
func parseNotifs(raw []byte, count int) ([]Notification, error) {
	out := make([]Notification, 0, count)
	for len(raw) > 0 {
		if len(raw) < 4 {
			return out, goErr("get notifications", ErrBackend, "truncated notification record")
		}
		nl := int(binary.NativeEndian.Uint32(raw))
		raw = raw[4:]
		if len(raw) < nl+4 {
			return out, goErr("get notifications", ErrBackend, "truncated notification record")
		}
		agent := string(raw[:nl])
		raw = raw[nl:]
		ml := int(binary.NativeEndian.Uint32(raw))
		raw = raw[4:]
		if len(raw) < ml {
			return out, goErr("get notifications", ErrBackend, "truncated notification record")
		}
		msg := make([]byte, ml)
		copy(msg, raw[:ml])
		raw = raw[ml:]
		out = append(out, Notification{Agent: agent, Msg: msg})
	}
	return out, nil
}

// SendNotification sends msg (arbitrary bytes) to a peer whose metadata is loaded, outside any transfer.
func (a *Agent) SendNotification(remote string, msg []byte, opts ...Option) error {
	op := "send notification"
	return a.withRemote(op, remote, opts, func(cr cString, o optHandle) error {
		return check(op, cGenNotif(a.h, cr, msg, o), fmt.Sprintf("to %s: is its metadata loaded?", remote))
	})
}

// WaitNotification polls GetNotifications until match accepts one, or ctx ends. Notifications that do
// not match are passed to other (may be nil; they are then dropped).
func (a *Agent) WaitNotification(ctx context.Context, match func(Notification) bool, other func(Notification)) (Notification, error) {
	var (
		found Notification
		ok    bool
		err   error
	)
	if cerr := notifBackoff.Until(ctx, func() bool {
		var ns []Notification
		if ns, err = a.GetNotifications(); err != nil {
			return true
		}
		for i := range ns {
			if !ok && match(ns[i]) {
				found, ok = ns[i], true
				continue
			}
			if other != nil {
				other(ns[i])
			}
		}
		return ok
	}); cerr != nil {
		return Notification{}, goErr("wait for a notification", nil, "agent %s: %w", a.name, cerr)
	}
	return found, err
}

// notifBackoff paces WaitNotification: notifications follow a peer's whole transfer, so there is no
// spinning, and the delay grows from 10 µs to 2 ms.
var notifBackoff = poll.Backoff{Min: 10 * time.Microsecond, Max: 2 * time.Millisecond}
