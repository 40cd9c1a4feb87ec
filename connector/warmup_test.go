package connector

import (
	"bytes"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gonixl/gonixl/connector/protocol"
	"github.com/gonixl/gonixl/internal/testenv"
)

// The handshake READs the prefill side's null block into the local one (the warm-up that sets the data
// path up before the first request's READ), in every profile's layout, and touches no other local block.
func TestHandshakeWarmsUp(t *testing.T) {
	for _, name := range []string{"0.16", "0.33"} {
		t.Run(name, func(t *testing.T) {
			p, _ := protocol.ProfileByName(name)
			pr := newPair(t, p, pairOpts{})
			g := pr.pcache.Geometry()
			for r := 0; r < g.NumRegions(); r++ {
				region := pr.pcache.Region(r)
				for i := range g.BlockLen() {
					region[i] = byte(0xa5 ^ r ^ int(i)) // block 0 of every region
				}
			}
			ctx := testenv.Context(t, 10*time.Second)
			kv, err := pr.pre.Hold(ctx, "w1", tinyBlock, patternFill(pr.pcache, 3))
			require.NoError(t, err)
			_, err = pr.dec.Pull(ctx, "w1", kv, []int{5})
			require.NoError(t, err)
			dg := pr.dcache.Geometry()
			for r := 0; r < dg.NumRegions(); r++ {
				require.True(t, bytes.Equal(pr.pcache.Region(r)[:g.BlockLen()], pr.dcache.Region(r)[:dg.BlockLen()]),
					"region %d: the local null block holds the prefill's", r)
				require.True(t, bytes.Equal(make([]byte, dg.BlockLen()), pr.dcache.Region(r)[dg.BlockLen():2*dg.BlockLen()]),
					"region %d: block 1 untouched", r)
			}
			requirePattern(t, pr.dcache, []int{5}, kv.RemoteBlockIDs[0], 3)
		})
	}
}
