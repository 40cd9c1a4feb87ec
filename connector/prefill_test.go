package connector

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/gonixl/gonixl/connector/protocol"
)

// A heartbeat extends a lease by 2/3 of it, as vLLM does (30 s lease → 20 s), also for the default lease, whose
// nanosecond product overflows int64.
func TestLeaseExtension(t *testing.T) {
	p33, _ := protocol.ProfileByName("0.33")
	p16, _ := protocol.ProfileByName("0.16")
	for _, c := range []struct {
		p    protocol.Profile
		hold time.Duration
		want time.Duration
	}{
		{p33, p33.LeaseDuration, 20 * time.Second},
		{p33, 3 * time.Second, 2 * time.Second},
		{p33, 10 * time.Minute, 400 * time.Second},
		{p16, time.Second, time.Second},
	} {
		pr := &Prefill{cfg: PrefillConfig{RoleConfig: RoleConfig{Profile: c.p}}, hold: c.hold}
		assert.InDelta(t, float64(c.want), float64(pr.leaseExtension()), float64(time.Microsecond), "%s hold %v", c.p.Name, c.hold)
	}
}
