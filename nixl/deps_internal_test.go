package nixl

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gonixl/gonixl/internal/testenv"
)

// preloadDeps loads a folder's libraries whatever their order: libgxa.so.1 needs libgxb.so (found by nothing
// but the preload) and is tried first, so it loads in the second pass; a symlink to a listed file is not
// loaded twice; a file that is no library is reported with dlopen's reason, and the rest still load.
func TestPreloadDeps(t *testing.T) {
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		testenv.Missing(t, "gcc (builds two tiny libraries)", err.Error())
	}
	dir := t.TempDir()
	build := func(name, src string, args ...string) {
		c := filepath.Join(dir, name+".c")
		require.NoError(t, os.WriteFile(c, []byte(src), 0o644))
		out, err := exec.Command(gcc, append([]string{"-shared", "-fPIC", "-o", filepath.Join(dir, name), c, "-Wl,-soname," + name}, args...)...).CombinedOutput()
		require.NoError(t, err, "%s", out)
		require.NoError(t, os.Remove(c))
	}
	build("libgxb.so", "int gx_dep_b(void) { return 7; }\n")
	build("libgxa.so.1", "int gx_dep_b(void);\nint gx_dep_a(void) { return gx_dep_b() + 1; }\n", "-L"+dir, "-l:libgxb.so")
	require.NoError(t, os.Symlink("libgxa.so.1", filepath.Join(dir, "libgxa.so")))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "libbad.so.1"), []byte("not an ELF file"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "README"), []byte("ignored"), 0o644))

	files, bad := depFiles([]string{dir, filepath.Join(dir, "missing")})
	require.Equal(t, []string{filepath.Join(dir, "libbad.so.1"), filepath.Join(dir, "libgxa.so.1"), filepath.Join(dir, "libgxb.so")}, files)
	require.Len(t, bad, 1)
	require.Contains(t, bad[0].Err, "dependency folder")

	deps := preloadDeps([]string{dir})
	require.Len(t, deps, 3, "%+v", deps)
	require.Equal(t, Dep{Path: filepath.Join(dir, "libgxb.so"), Soname: "libgxb.so"}, deps[0])
	require.Equal(t, Dep{Path: filepath.Join(dir, "libgxa.so.1"), Soname: "libgxa.so.1"}, deps[1], "loaded in the second pass")
	require.Equal(t, filepath.Join(dir, "libbad.so.1"), deps[2].Path)
	require.NotEmpty(t, deps[2].Err)

	t.Setenv(EnvDepDirs, dir+string(os.PathListSeparator)+"/x/")
	require.Equal(t, []string{"/y", dir, "/x"}, depDirs([]string{"/y", dir}))
}
