package nixl

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gonixl/gonixl/internal/dl"
)

// The search order, pinned: the explicit folder, $NIXL_LIB_DIR's, the loader's search path, then
// StandardPaths, each standard candidate looked for in its own folder (where its plugins are).
func TestLoadCandidates(t *testing.T) {
	standard := []dl.Candidate{
		{Path: LibraryName, Source: "dynamic loader search path"},
		{Path: "/opt/nvidia/nvda_nixl/lib/x86_64-linux-gnu/libnixl_capi.so", Source: "standard location"},
		{Path: "/opt/nvidia/nvda_nixl/lib64/libnixl_capi.so", Source: "standard location"},
		{Path: "/opt/nvidia/nvda_nixl/lib/libnixl_capi.so", Source: "standard location"},
	}
	t.Setenv(EnvLibDir, "")
	require.Equal(t, standard, candidates(""))
	t.Setenv(EnvLibDir, "/env/nixl")
	require.Equal(t, append([]dl.Candidate{
		{Path: "/explicit/libnixl_capi.so", Source: "LoadOptions.LibDir"},
		{Path: "/env/nixl/libnixl_capi.so", Source: "$" + EnvLibDir},
	}, standard...), candidates("/explicit"))
	// The same folder given twice is tried once.
	require.Equal(t, append([]dl.Candidate{{Path: "/env/nixl/libnixl_capi.so", Source: "LoadOptions.LibDir"}}, standard...),
		candidates("/env/nixl"))
	// Each candidate's folder is where its plugins are looked for; the bare name has none.
	require.Equal(t, "/opt/nvidia/nvda_nixl/lib64", candidateDir(standard[2]))
	require.Empty(t, candidateDir(standard[0]))
}
