package elfdeps

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/gonixl/gonixl/internal/testenv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// cc compiles C source into a shared object with gcc; extra are linker/compiler arguments.
func cc(t *testing.T, dir, out, src string, extra ...string) string {
	t.Helper()
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		testenv.Missing(t, "gcc (builds the test's shared objects)", err.Error())
	}
	srcPath := filepath.Join(dir, strings.TrimSuffix(filepath.Base(out), filepath.Ext(out))+".c")
	require.NoError(t, os.WriteFile(srcPath, []byte(src), 0o644))
	outPath := filepath.Join(dir, out)
	args := append([]string{"-shared", "-fPIC", "-o", outPath, srcPath}, extra...)
	b, err := exec.Command(gcc, args...).CombinedOutput()
	require.NoError(t, err, "gcc %v: %s", args, b)
	return outPath
}

func writeFile(t *testing.T, path, s string) string {
	t.Helper()
	require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
	require.NoError(t, os.WriteFile(path, []byte(s), 0o644))
	return path
}

// A library at two versions: the new one defines V_2 (f2), the old one only V_1 (f1). A consumer linked
// against the new one needs f2@V_2; pointed at the old one, the report names the version, where it looked
// and what the old library has. Beside that: a needed library found nowhere, a transitive one, $ORIGIN.
func TestCheck(t *testing.T) {
	root := t.TempDir()
	newDir, oldDir := filepath.Join(root, "new"), filepath.Join(root, "old")
	require.NoError(t, os.MkdirAll(newDir, 0o755))
	require.NoError(t, os.MkdirAll(oldDir, 0o755))
	mapNew := writeFile(t, filepath.Join(root, "new.map"), "V_1 { global: f1; local: *; };\nV_2 { global: f2; } V_1;\n")
	mapOld := writeFile(t, filepath.Join(root, "old.map"), "V_1 { global: f1; local: *; };\n")
	cc(t, newDir, "libv.so.1", "int f1(void){return 1;}\nint f2(void){return 2;}\n", "-Wl,-soname,libv.so.1", "-Wl,--version-script="+mapNew)
	cc(t, oldDir, "libv.so.1", "int f1(void){return 1;}\n", "-Wl,-soname,libv.so.1", "-Wl,--version-script="+mapOld)
	// The link needs a libv.so name; the consumer's DT_NEEDED is the soname.
	require.NoError(t, os.Symlink("libv.so.1", filepath.Join(newDir, "libv.so")))

	// A leaf library the middle one needs, then removed: missing one level down.
	leafDir := filepath.Join(root, "leaf")
	require.NoError(t, os.MkdirAll(leafDir, 0o755))
	cc(t, leafDir, "libleaf.so.1", "int leaf(void){return 3;}\n", "-Wl,-soname,libleaf.so.1")
	require.NoError(t, os.Symlink("libleaf.so.1", filepath.Join(leafDir, "libleaf.so")))
	// The middle library sits in a sub-folder the consumer finds through its $ORIGIN runpath.
	midDir := filepath.Join(root, "app", "sub")
	require.NoError(t, os.MkdirAll(midDir, 0o755))
	cc(t, midDir, "libmid.so", "int leaf(void);\nint mid(void){return leaf();}\n", "-Wl,-soname,libmid.so", "-L"+leafDir, "-lleaf")
	require.NoError(t, os.Remove(filepath.Join(leafDir, "libleaf.so.1")))

	// The consumer also needs a library that never existed.
	goneDir := filepath.Join(root, "gone")
	require.NoError(t, os.MkdirAll(goneDir, 0o755))
	cc(t, goneDir, "libgone.so.7", "int gone(void){return 4;}\n", "-Wl,-soname,libgone.so.7")
	require.NoError(t, os.Symlink("libgone.so.7", filepath.Join(goneDir, "libgone.so")))
	consumer := cc(t, filepath.Join(root, "app"), "libconsumer.so",
		"int f1(void); int f2(void); int mid(void); int gone(void);\nint c(void){return f1()+f2()+mid()+gone();}\n",
		"-L"+newDir, "-lv", "-L"+midDir, "-lmid", "-L"+goneDir, "-lgone", "-Wl,--disable-new-dtags", "-Wl,-rpath,$ORIGIN/sub")
	require.NoError(t, os.RemoveAll(goneDir))

	r, err := Check(consumer, Options{LibraryPath: []string{oldDir}, NoLoaded: true})
	require.NoError(t, err)
	require.False(t, r.OK())
	require.Equal(t, filepath.Join(oldDir, "libv.so.1"), r.Resolved["libv.so.1"])
	require.Equal(t, filepath.Join(midDir, "libmid.so"), r.Resolved["libmid.so"], "$ORIGIN in DT_RPATH")
	names := map[string]MissingLib{}
	for _, m := range r.Missing {
		names[m.Name] = m
	}
	require.Len(t, names, 2, "%+v", r.Missing)
	require.Equal(t, consumer, names["libgone.so.7"].RequiredBy)
	require.Equal(t, filepath.Join(midDir, "libmid.so"), names["libleaf.so.1"].RequiredBy, "missing one level down")
	require.Equal(t, []string{midDir, oldDir}, names["libgone.so.7"].Searched[:2], "DT_RPATH before LD_LIBRARY_PATH")
	require.Len(t, r.MissingVersions, 1)
	mv := r.MissingVersions[0]
	require.Equal(t, "libv.so.1", mv.Library)
	require.Equal(t, "V_2", mv.Version)
	require.Equal(t, []string{"V_1"}, mv.Has)
	require.Equal(t, consumer, mv.RequiredBy)
	probs := strings.Join(r.Problems(), "\n")
	require.Contains(t, probs, "libgone.so.7: not found (needed by libconsumer.so)")
	require.Contains(t, probs, "libleaf.so.1: not found (needed by libmid.so)")
	require.Contains(t, probs, "libv.so.1: version V_2 not found in "+filepath.Join(oldDir, "libv.so.1")+" (it defines V_1; needed by libconsumer.so)")

	// The new library satisfies the version; only the two missing libraries remain.
	r, err = Check(consumer, Options{LibraryPath: []string{newDir}, NoLoaded: true})
	require.NoError(t, err)
	require.Empty(t, r.MissingVersions)
	require.Len(t, r.Missing, 2)
	// Undefined symbols follow from the missing libraries and are listed only when nothing else is.
	require.NotEmpty(t, r.Undefined)
	require.NotContains(t, strings.Join(r.Problems(), "\n"), "undefined symbol")
}

// With everything present, the report is empty; a symbol no library defines is then named.
func TestCheckUndefinedSymbol(t *testing.T) {
	dir := t.TempDir()
	lib := cc(t, dir, "libalone.so", "int nowhere(void);\nint a(void){return nowhere();}\n")
	r, err := Check(lib, Options{LibraryPath: []string{}})
	require.NoError(t, err)
	require.Empty(t, r.Missing)
	require.Empty(t, r.MissingVersions)
	require.Equal(t, []string{"undefined symbol nowhere (needed by libalone.so)"}, r.Problems())

	ok := cc(t, dir, "libfine.so", "int a(void){return 1;}\n")
	r, err = Check(ok, Options{})
	require.NoError(t, err)
	require.True(t, r.OK(), "%v", r.Problems())
	require.Empty(t, r.Problems())
}

func TestCheckNotELF(t *testing.T) {
	p := writeFile(t, filepath.Join(t.TempDir(), "x.so"), "not an elf file at all")
	_, err := Check(p, Options{})
	require.ErrorIs(t, err, ErrNotELF)
	short := writeFile(t, filepath.Join(t.TempDir(), "short.so"), "text")
	_, err = Check(short, Options{})
	require.ErrorIs(t, err, ErrNotELF, "shorter than an ELF header")
	_, err = Check(filepath.Join(t.TempDir(), "absent.so"), Options{})
	require.ErrorIs(t, err, os.ErrNotExist)
}

func TestVersionLess(t *testing.T) {
	require.True(t, versionLess("FABRIC_1.9", "FABRIC_1.10"))
	require.False(t, versionLess("FABRIC_1.10", "FABRIC_1.9"))
	require.True(t, versionLess("FABRIC_1.0", "FABRIC_1.1"))
	require.True(t, versionLess("GLIBC_2.2.5", "GLIBC_2.14"))
	require.False(t, versionLess("V_1", "V_1"))
	require.Equal(t, []string{"FABRIC_1.0", "FABRIC_1.2", "FABRIC_1.9", "FABRIC_1.10"},
		sortedVersions(map[string]bool{"FABRIC_1.10": true, "FABRIC_1.0": true, "FABRIC_1.9": true, "FABRIC_1.2": true}))
}

// DT_RUNPATH (the default of current linkers) is searched after LD_LIBRARY_PATH, DT_RPATH before it: the
// same consumer resolves to the LD_LIBRARY_PATH copy with a runpath and to its own copy with an rpath.
func TestCheckRunpathOrder(t *testing.T) {
	root := t.TempDir()
	own, env := filepath.Join(root, "own"), filepath.Join(root, "env")
	for _, d := range []string{own, env} {
		require.NoError(t, os.MkdirAll(d, 0o755))
		cc(t, d, "libw.so.1", "int w(void){return 1;}\n", "-Wl,-soname,libw.so.1")
		require.NoError(t, os.Symlink("libw.so.1", filepath.Join(d, "libw.so")))
	}
	withRunpath := cc(t, root, "librun.so", "int w(void);\nint r(void){return w();}\n",
		"-L"+own, "-lw", "-Wl,--enable-new-dtags", "-Wl,-rpath,"+own)
	withRpath := cc(t, root, "librp.so", "int w(void);\nint r(void){return w();}\n",
		"-L"+own, "-lw", "-Wl,--disable-new-dtags", "-Wl,-rpath,"+own)

	r, err := Check(withRunpath, Options{LibraryPath: []string{env}, NoLoaded: true})
	require.NoError(t, err)
	require.True(t, r.OK(), "%v", r.Problems())
	require.Equal(t, filepath.Join(env, "libw.so.1"), r.Resolved["libw.so.1"], "LD_LIBRARY_PATH before DT_RUNPATH")
	r, err = Check(withRpath, Options{LibraryPath: []string{env}, NoLoaded: true})
	require.NoError(t, err)
	require.Equal(t, filepath.Join(own, "libw.so.1"), r.Resolved["libw.so.1"], "DT_RPATH before LD_LIBRARY_PATH")
	r, err = Check(withRunpath, Options{LibraryPath: []string{}, NoLoaded: true})
	require.NoError(t, err)
	require.Equal(t, filepath.Join(own, "libw.so.1"), r.Resolved["libw.so.1"], "DT_RUNPATH when LD_LIBRARY_PATH has none")
}

// FuzzCheck: any file content gives a report or an error, never a panic.
func FuzzCheck(f *testing.F) {
	f.Add([]byte("\x7fELF"))
	f.Add([]byte("\x7fELF\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x03\x00\x3e\x00\x01\x00\x00\x00"))
	f.Add([]byte("not an elf file at all"))
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, b []byte) {
		p := filepath.Join(dir, "f.so")
		require.NoError(t, os.WriteFile(p, b, 0o644))
		r, err := Check(p, Options{LibraryPath: []string{}, SystemDirs: []string{}, NoLoaded: true})
		if err == nil {
			require.NotNil(t, r)
			_ = r.Problems()
		}
	})
}
