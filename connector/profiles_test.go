package connector

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/gonixl/gonixl/connector/protocol"
)

// roleProfiles is the set of profiles the role tests (real NIXL transfers, seconds each) run: the oldest and the
// newest row, plus the first row of every distinct (framing, layout era, leases) combination: today
// 0.16, 0.22, 0.23, 0.26 and 0.33, which also cover both remote_block_ids shapes (0.16 flat, the rest grouped)
// and both notification meanings (D's TP size up to 0.28, consumers from 0.29). The other rows differ from these
// in metadata fields, hash factors and params keys, which the protocol package's vector tests and the
// side-channel interop tests check for every row. With all 13 rows `go test -race ./connector/` would take
// several times its two-profile time.
func roleProfiles() []protocol.Profile {
	all := protocol.Profiles
	seen := map[string]bool{}
	var out []protocol.Profile
	for i, p := range all {
		k := fmt.Sprint(p.Framing, p.Layout, p.Leases)
		if i == 0 || i == len(all)-1 || !seen[k] {
			out = append(out, p)
		}
		seen[k] = true
	}
	return out
}

func TestRoleProfilesCoverEveryBehaviour(t *testing.T) {
	got := map[string]bool{}
	for _, p := range roleProfiles() {
		got[fmt.Sprint(p.Framing, p.Layout, p.Leases)] = true
		got[fmt.Sprint("ids", p.BlockIDs)] = true
		got[fmt.Sprint("notif", p.Notif)] = true
	}
	for _, p := range protocol.Profiles {
		for _, k := range []string{fmt.Sprint(p.Framing, p.Layout, p.Leases), fmt.Sprint("ids", p.BlockIDs),
			fmt.Sprint("notif", p.Notif)} {
			assert.True(t, got[k], "profile %s: %s is not exercised by the role tests", p.Name, k)
		}
	}
	rp := roleProfiles()
	assert.Equal(t, protocol.Profiles[0].Name, rp[0].Name)
	assert.Equal(t, protocol.Profiles[len(protocol.Profiles)-1].Name, rp[len(rp)-1].Name)
}
