// Package dl holds what gonixl's run-time loaders share (nixl.Load, cuda.Load, neuron.Load): one search
// order for a native library and one error that lists every place tried. Each loader keeps its own dlopen
// call (its cgo preamble declares the library's functions); this package has no cgo.
//
// The search order, for every loader: LoadOptions' explicit location, then the loader's environment
// variable, then the library's soname through the dynamic loader's search path (LD_LIBRARY_PATH,
// ld.so.cache), then the loader's standard install locations.
package dl

import (
	"os"
	"strings"
)

// Candidate is one place a loader tries: a file path, a folder holding the library, or a soname resolved
// by the dynamic loader.
type Candidate struct {
	Path   string
	Source string // why it is tried, e.g. "LoadOptions.Path", "$GONIXL_CUDA_LIB", "dynamic loader search path"
}

// Sources of candidates, as Search names them.
const (
	SourceLoader   = "dynamic loader search path"
	SourceStandard = "standard location"
)

// Search lists the candidates in the one search order: explicit (named by field, e.g. "LoadOptions.Path"),
// the value of the environment variable env (read with getenv), soname through the dynamic loader, then
// standard. Empty and repeated entries are dropped.
func Search(field, explicit, env string, getenv func(string) string, soname string, standard []string) []Candidate {
	var out []Candidate
	seen := map[string]bool{}
	add := func(path, source string) {
		if path != "" && !seen[path] {
			seen[path] = true
			out = append(out, Candidate{Path: path, Source: source})
		}
	}
	add(explicit, field)
	if env != "" {
		add(getenv(env), "$"+env)
	}
	add(soname, SourceLoader)
	for _, p := range standard {
		add(p, SourceStandard)
	}
	return out
}

// PathSearch is the candidate list of a loader whose options are a file Path and NoSearch (cuda.Load,
// neuron.Load): Path alone when noSearch is set and Path is not empty, else Search from Path with the
// process environment.
func PathSearch(path string, noSearch bool, env, soname string, standard []string) []Candidate {
	if noSearch && path != "" {
		return []Candidate{{Path: path, Source: "LoadOptions.Path"}}
	}
	return Search("LoadOptions.Path", path, env, os.Getenv, soname, standard)
}

// LoadError reports that no candidate of a library could be loaded: each one tried, in order, with why it
// failed, and what to do. errors.Is(err, Sentinel) holds (the package's ErrNotLoaded).
type LoadError struct {
	Prefix   string   // the package, e.g. "cuda"
	Library  string   // the library's file name, e.g. "libcuda.so.1"
	Tried    []string // each candidate path, folder or name, in the order tried
	Why      []string // the matching reason (dlopen's message, "not present", a missing symbol)
	Fix      string   // what to do
	Sentinel error
}

// Add records a failed candidate.
func (e *LoadError) Add(tried, why string) {
	e.Tried = append(e.Tried, tried)
	e.Why = append(e.Why, why)
}

func (e *LoadError) Error() string {
	var b strings.Builder
	b.WriteString(e.Prefix + ": cannot load " + e.Library + "; " + e.Fix + ". Tried:")
	for i, t := range e.Tried {
		b.WriteString("\n  - " + t)
		if i < len(e.Why) && e.Why[i] != "" {
			b.WriteString(": " + e.Why[i])
		}
	}
	return b.String()
}

// Unwrap returns the package's sentinel.
func (e *LoadError) Unwrap() error { return e.Sentinel }
