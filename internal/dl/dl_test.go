package dl

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestSearchOrderAndDedup(t *testing.T) {
	env := map[string]string{"GONIXL_X_LIB": "/env/libx.so.1"}
	got := Search("LoadOptions.Path", "/explicit/libx.so.1", "GONIXL_X_LIB", func(k string) string { return env[k] },
		"libx.so.1", []string{"/std/libx.so.1", "/env/libx.so.1"})
	assert.Equal(t, []Candidate{
		{"/explicit/libx.so.1", "LoadOptions.Path"},
		{"/env/libx.so.1", "$GONIXL_X_LIB"},
		{"libx.so.1", SourceLoader},
		{"/std/libx.so.1", SourceStandard},
	}, got)
	got = Search("LoadOptions.Path", "", "GONIXL_Y_LIB", func(string) string { return "" }, "liby.so.1", nil)
	assert.Equal(t, []Candidate{{"liby.so.1", SourceLoader}}, got)
}

func TestPathSearch(t *testing.T) {
	t.Setenv("GONIXL_X_LIB", "/env/libx.so.1")
	std := []string{"/std/libx.so.1"}
	assert.Equal(t, []Candidate{{"/p/libx.so.1", "LoadOptions.Path"}}, PathSearch("/p/libx.so.1", true, "GONIXL_X_LIB", "libx.so.1", std),
		"NoSearch: Path alone")
	assert.Equal(t, []Candidate{
		{"/p/libx.so.1", "LoadOptions.Path"},
		{"/env/libx.so.1", "$GONIXL_X_LIB"},
		{"libx.so.1", SourceLoader},
		{"/std/libx.so.1", SourceStandard},
	}, PathSearch("/p/libx.so.1", false, "GONIXL_X_LIB", "libx.so.1", std))
	assert.Equal(t, []Candidate{{"/env/libx.so.1", "$GONIXL_X_LIB"}, {"libx.so.1", SourceLoader}, {"/std/libx.so.1", SourceStandard}},
		PathSearch("", true, "GONIXL_X_LIB", "libx.so.1", std), "NoSearch without a Path searches (Load refuses it before)")
}

func TestLoadError(t *testing.T) {
	sentinel := errors.New("x: not loaded")
	e := &LoadError{Prefix: "x", Library: "libx.so.1", Fix: "install x", Sentinel: sentinel}
	e.Add("/a/libx.so.1", "not present")
	e.Add("libx.so.1", "")
	var err error = e
	require.ErrorIs(t, err, sentinel)
	assert.Equal(t, "x: cannot load libx.so.1; install x. Tried:\n  - /a/libx.so.1: not present\n  - libx.so.1", err.Error())
}
