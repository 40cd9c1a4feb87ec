package nixl

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// The search order, pinned: the explicit folder, $NIXL_LIB_DIR's, the loader's search path, then
// StandardPaths, each standard candidate looked for in its own folder (where its plugins are).
func TestLoadCandidates(t *testing.T) {
	standard := []candidate{
		{path: LibraryName, source: "dynamic loader search path"},
		{dir: "/opt/nvidia/nvda_nixl/lib/x86_64-linux-gnu", path: "/opt/nvidia/nvda_nixl/lib/x86_64-linux-gnu/libnixl_capi.so", source: "standard location"},
		{dir: "/opt/nvidia/nvda_nixl/lib64", path: "/opt/nvidia/nvda_nixl/lib64/libnixl_capi.so", source: "standard location"},
		{dir: "/opt/nvidia/nvda_nixl/lib", path: "/opt/nvidia/nvda_nixl/lib/libnixl_capi.so", source: "standard location"},
	}
	t.Setenv(EnvLibDir, "")
	require.Equal(t, standard, candidates(""))
	t.Setenv(EnvLibDir, "/env/nixl")
	require.Equal(t, append([]candidate{
		{dir: "/explicit", path: "/explicit/libnixl_capi.so", source: "LoadOptions.LibDir"},
		{dir: "/env/nixl", path: "/env/nixl/libnixl_capi.so", source: EnvLibDir},
	}, standard...), candidates("/explicit"))
}
