package protocol

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gonixl/gonixl/layout"
)

// TestBackendOrder: a CPU_ATTN peer's bytes are CPU_ATTN's format whatever its label says, on every row that
// can transfer them; other backends keep the label's order; era B refuses CPU_ATTN.
func TestBackendOrder(t *testing.T) {
	for _, p := range Profiles {
		for _, label := range []layout.BlockOrder{layout.HND, layout.NHD} {
			got, err := p.BackendOrder(label, "FLASH_ATTN", 0)
			require.NoError(t, err)
			assert.Equal(t, label, got, p.Name)
			got, err = p.BackendOrder(label, AttnBackendCPU, 0)
			if p.Layout == LayoutB {
				assert.ErrorIs(t, err, layout.ErrUnsupportedLayout, p.Name)
				continue
			}
			require.NoError(t, err, p.Name)
			assert.Equal(t, layout.CPUAttn, got, "%s: label %v", p.Name, label)
		}
		_, err := p.BackendOrder(layout.HND, AttnBackendCPU, layout.NHD)
		if p.Layout != LayoutB {
			assert.ErrorIs(t, err, layout.ErrInvalidGeometry, p.Name)
		}
		name, err := p.LayoutName(layout.CPUAttn)
		require.NoError(t, err)
		assert.Equal(t, p.Labels[0].Name, name, "%s: CPU_ATTN is published under the HND label", p.Name)
		name, err = p.LayoutName(layout.CPUAttnAMX)
		require.NoError(t, err)
		assert.Equal(t, p.Labels[0].Name, name, "%s: CPU_ATTN's AMX packing is published under the HND label too", p.Name)
	}
}
