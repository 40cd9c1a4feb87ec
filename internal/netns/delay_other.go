//go:build !linux

package netns

import (
	"errors"
	"time"
)

// QueueMaxLen bounds the packets a Delayer's queue holds at once.
const QueueMaxLen = 4096

// A Delayer is added latency through a netfilter queue; Linux only.
type Delayer struct{}

// NewDelayer fails: netfilter queues are Linux's.
func NewDelayer(ns string, queue uint16, delay, jitter time.Duration) (*Delayer, error) {
	return nil, errors.New("netns: the delayer needs Linux (netfilter queues)")
}

// Packets is how many packets the Delayer has been handed so far.
func (d *Delayer) Packets() int64 { return 0 }

// Held is the shortest and the longest time a packet was held.
func (d *Delayer) Held() (shortest, longest time.Duration) { return 0, 0 }

// Err is the first error the Delayer met while running.
func (d *Delayer) Err() error { return nil }

// Close stops the Delayer.
func (d *Delayer) Close() error { return nil }
