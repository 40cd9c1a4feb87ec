package protocol

import (
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// HeartbeatPrefix starts a lease-renewal notification ("HB:<id>,<id>,…") in profiles with leases.
const HeartbeatPrefix = "HB:"

const objNotif = "notification"

// Notification is a NIXL notification message of the connector: either a transfer notification
// "<remote_request_id>:<count>" that D attaches to its READ (or sends alone on a full prefix hit), or, in
// profiles with leases, a heartbeat "HB:<id1>,<id2>,…" listing P request ids whose leases D renews.
type Notification struct {
	// RequestID is P's request id (kv_transfer_params.remote_request_id). Empty for a heartbeat.
	RequestID string
	// Count is the number after the last ':'. Its meaning is Profile.Notif: D's TP size (NotifDecodeTPSize)
	// or the number of notifications P must wait for (NotifConsumers).
	Count int
	// Heartbeat lists the request ids of a heartbeat; nil for a transfer notification.
	Heartbeat []string
}

// IsHeartbeat reports whether n is a lease heartbeat.
func (n Notification) IsHeartbeat() bool { return n.Heartbeat != nil }

// EncodeNotification encodes a transfer notification (Heartbeat must be nil) or, where the profile has leases,
// a heartbeat.
func (p Profile) EncodeNotification(n Notification) ([]byte, error) {
	if n.Heartbeat != nil {
		return p.EncodeHeartbeat(n.Heartbeat)
	}
	if n.RequestID == "" || !utf8.ValidString(n.RequestID) {
		return nil, invalid(objNotif, "request_id", "must be a non-empty UTF-8 string, got %q", n.RequestID)
	}
	if p.Leases && strings.HasPrefix(n.RequestID, HeartbeatPrefix) {
		return nil, invalid(objNotif, "request_id", "%q starts with %q and would be read as a heartbeat", n.RequestID, HeartbeatPrefix)
	}
	if n.Count < 1 {
		return nil, invalid(objNotif, "count", "must be >= 1, got %d", n.Count)
	}
	return []byte(n.RequestID + ":" + strconv.Itoa(n.Count)), nil
}

// EncodeHeartbeat encodes "HB:<id1>,<id2>,…". Profiles without leases return ErrUnsupported: an older P would
// read "HB" as a request id.
func (p Profile) EncodeHeartbeat(ids []string) ([]byte, error) {
	if !p.Leases {
		return nil, fmt.Errorf("%w: vLLM %s has no leases; heartbeats would be misread as transfer notifications", ErrUnsupported, p.Name)
	}
	if len(ids) == 0 {
		return nil, invalid(objNotif, "heartbeat", "no request ids")
	}
	for _, id := range ids {
		if id == "" || strings.Contains(id, ",") || !utf8.ValidString(id) {
			return nil, invalid(objNotif, "heartbeat", "request id %q must be non-empty UTF-8 without ','", id)
		}
	}
	return []byte(HeartbeatPrefix + strings.Join(ids, ",")), nil
}

// DecodeNotification parses a notification as P does: UTF-8, then (with leases) the "HB:" prefix, then a split
// at the last ':'. It returns an error wrapping ErrMalformed instead of raising on bad input.
func (p Profile) DecodeNotification(b []byte) (Notification, error) {
	if !utf8.Valid(b) {
		return Notification{}, malformed(objNotif, "", "not valid UTF-8")
	}
	s := string(b)
	if p.Leases && strings.HasPrefix(s, HeartbeatPrefix) {
		ids := strings.Split(s[len(HeartbeatPrefix):], ",")
		return Notification{Heartbeat: ids}, nil
	}
	i := strings.LastIndexByte(s, ':')
	if i < 0 {
		return Notification{}, malformed(objNotif, "", "%q has no ':' before the count", s)
	}
	id, num := s[:i], s[i+1:]
	if id == "" {
		return Notification{}, malformed(objNotif, "request_id", "empty request id in %q", s)
	}
	if num == "" || len(num) > 9 || strings.TrimLeft(num, "0123456789") != "" {
		return Notification{}, malformed(objNotif, "count", "%q is not a decimal count", num)
	}
	c, _ := strconv.Atoi(num)
	if c < 1 {
		return Notification{}, malformed(objNotif, "count", "count must be >= 1, got %d", c)
	}
	return Notification{RequestID: id, Count: c}, nil
}

// ExpectedNotifications returns how many transfer notifications a prefill rank waits for before it frees a
// request's blocks, given one decoded notification and P's own TP size, per the profile's NotifMeaning.
func (p Profile) ExpectedNotifications(n Notification, prefillTP int) (int, error) {
	if n.IsHeartbeat() {
		return 0, invalid(objNotif, "", "a heartbeat carries no count")
	}
	if prefillTP < 1 {
		return 0, invalid(objNotif, "", "prefill TP size must be >= 1, got %d", prefillTP)
	}
	switch p.Notif {
	case NotifConsumers:
		return n.Count, nil
	case NotifDecodeTPSize:
		// vLLM 0.16: D_tp > P_tp → D_tp / P_tp readers per P rank; otherwise exactly one.
		if n.Count > prefillTP {
			return n.Count / prefillTP, nil
		}
		return 1, nil
	}
	return 0, fmt.Errorf("%w: profile %s has notification meaning %d", ErrUnsupported, p.Name, p.Notif)
}
