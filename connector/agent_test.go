package connector

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gonixl/gonixl/nixl"
)

func TestParseBackends(t *testing.T) {
	assert.Equal(t, []nixl.BackendSpec{{Plugin: "LIBFABRIC"}}, ParseBackends([]string{"LIBFABRIC"}))
	ucx, err := nixl.DefaultUCXOptions().Spec()
	require.NoError(t, err)
	assert.Equal(t, []nixl.BackendSpec{ucx, {Plugin: "LIBFABRIC"}}, ParseBackends([]string{" ucx ", "", "libfabric"}))
	assert.Empty(t, ParseBackends(nil))
	assert.Empty(t, ParseBackends([]string{" ", ""}))
	assert.Equal(t, []nixl.BackendSpec{ucx}, DefaultBackends)
	assert.Contains(t, ucx.Params["engine_config"], "RMA_PPLN_ENABLE=y", "RMA pipeline on by default")
}
