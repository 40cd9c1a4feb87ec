// Package elfdeps tells, without loading anything, why the dynamic loader would refuse a shared object:
// every DT_NEEDED library it cannot find (in the whole dependency closure, not only the first), every symbol
// version a found library does not define (the .gnu.version_r needs, e.g. libfabric.so.1's FABRIC_1.10), and
// every strong undefined symbol that no object of the closure defines. It follows glibc's search order:
// the requester's DT_RPATH (when it has no DT_RUNPATH), LD_LIBRARY_PATH, the requester's DT_RUNPATH,
// libraries already loaded into this process (by file name or soname), the folders of /etc/ld.so.conf, and
// the default folders. $ORIGIN, $LIB and $PLATFORM are expanded. It reads files with debug/elf only, so it
// builds without cgo and never runs a library's code.
package elfdeps

import (
	"bufio"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// Options steer the search. The zero value reads LD_LIBRARY_PATH from the environment, the process's
// loaded libraries from /proc/self/maps and the system folders from /etc/ld.so.conf.
type Options struct {
	// LibraryPath replaces $LD_LIBRARY_PATH when non-nil.
	LibraryPath []string
	// SystemDirs replaces the ld.so.conf and default folders when non-nil.
	SystemDirs []string
	// NoLoaded skips the libraries already mapped into this process.
	NoLoaded bool
}

// Report is what Check found. A Report with no Missing, MissingVersions and Undefined says the loader
// would accept the object (as far as files tell: constructors can still fail).
type Report struct {
	// Object is the path checked.
	Object string
	// Resolved maps each needed name found to the file it resolves to.
	Resolved map[string]string
	// Missing lists needed libraries that were found nowhere, with who needs them.
	Missing []MissingLib
	// MissingVersions lists symbol versions a found library does not define.
	MissingVersions []MissingVersion
	// Undefined lists strong undefined symbols no object in the closure defines.
	Undefined []UndefinedSymbol
}

// MissingLib is a DT_NEEDED entry the loader would not find.
type MissingLib struct {
	Name       string   // e.g. "libfabric.so.1"
	RequiredBy string   // the object whose DT_NEEDED names it
	Searched   []string // the folders looked in, in order
}

// MissingVersion is a version need (.gnu.version_r) that the found library does not define.
type MissingVersion struct {
	Library    string   // the needed name, e.g. "libfabric.so.1"
	Path       string   // the file it resolved to
	Version    string   // e.g. "FABRIC_1.10"
	RequiredBy string   // the object that needs it
	Has        []string // the versions the library defines (sorted)
}

// UndefinedSymbol is a strong undefined symbol that nothing in the closure defines.
type UndefinedSymbol struct {
	Name       string
	Version    string
	RequiredBy string
}

// OK reports whether nothing is missing.
func (r *Report) OK() bool {
	return len(r.Missing) == 0 && len(r.MissingVersions) == 0 && len(r.Undefined) == 0
}

// Problems returns one line per missing library, version and symbol (in that order); empty when OK.
// Undefined symbols are listed only when no library or version is missing (they usually follow from those).
func (r *Report) Problems() []string {
	var out []string
	for _, m := range r.Missing {
		out = append(out, fmt.Sprintf("%s: not found (needed by %s)", m.Name, filepath.Base(m.RequiredBy)))
	}
	for _, v := range r.MissingVersions {
		has := "none"
		if len(v.Has) > 0 {
			has = v.Has[len(v.Has)-1]
			if len(v.Has) > 1 {
				has = "up to " + has
			}
		}
		out = append(out, fmt.Sprintf("%s: version %s not found in %s (it defines %s; needed by %s)",
			v.Library, v.Version, v.Path, has, filepath.Base(v.RequiredBy)))
	}
	if len(out) == 0 {
		for _, u := range r.Undefined {
			name := u.Name
			if u.Version != "" {
				name += "@" + u.Version
			}
			out = append(out, fmt.Sprintf("undefined symbol %s (needed by %s)", name, filepath.Base(u.RequiredBy)))
		}
	}
	return out
}

type object struct {
	path     string
	needed   []string
	rpath    []string
	runpath  []string
	soname   string
	verneed  []elf.DynamicVersionNeed
	versions map[string]bool
	defined  map[string]map[string]bool // symbol -> versions defined ("" = unversioned/default)
	undef    []elf.Symbol
	class    elf.Class
	machine  elf.Machine
}

// ErrNotELF says the file checked is not an ELF shared object or executable.
var ErrNotELF = errors.New("elfdeps: not an ELF file")

// Check walks the dependency closure of the object at path.
func Check(path string, opts Options) (*Report, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, err
	}
	root, err := readObject(abs)
	if err != nil {
		return nil, err
	}
	ldPath := opts.LibraryPath
	if ldPath == nil {
		ldPath = splitPath(os.Getenv("LD_LIBRARY_PATH"))
	}
	sys := opts.SystemDirs
	if sys == nil {
		sys = systemDirs()
	}
	var loadedLibs map[string]string
	if !opts.NoLoaded {
		loadedLibs = loadedLibraries()
	}
	r := &Report{Object: abs, Resolved: map[string]string{}}
	objs := map[string]*object{abs: root}
	order := []*object{root}
	queue := []*object{root}
	for len(queue) > 0 {
		o := queue[0]
		queue = queue[1:]
		for _, name := range o.needed {
			if _, done := r.Resolved[name]; done {
				continue
			}
			p, searched := resolve(name, o, ldPath, sys, loadedLibs)
			if p == "" {
				if !hasMissing(r.Missing, name) {
					r.Missing = append(r.Missing, MissingLib{Name: name, RequiredBy: o.path, Searched: searched})
				}
				continue
			}
			r.Resolved[name] = p
			if _, seen := objs[p]; seen {
				continue
			}
			dep, err := readObject(p)
			if err != nil {
				continue // resolve only returns readable objects of the right class; a race is not worth more
			}
			objs[p] = dep
			order = append(order, dep)
			queue = append(queue, dep)
		}
	}
	// Version needs: each need names a file (a DT_NEEDED name) and versions it must define.
	for _, o := range order {
		for _, vn := range o.verneed {
			p, ok := r.Resolved[vn.Name]
			if !ok {
				continue // reported as missing already
			}
			lib := objs[p]
			if len(lib.versions) == 0 {
				continue // the loader does not check versions against an unversioned library
			}
			for _, n := range vn.Needs {
				if n.Flags&elf.VER_FLG_WEAK != 0 || lib.versions[n.Dep] {
					continue
				}
				r.MissingVersions = append(r.MissingVersions, MissingVersion{
					Library: vn.Name, Path: p, Version: n.Dep, RequiredBy: o.path, Has: sortedVersions(lib.versions),
				})
			}
		}
	}
	// Strong undefined symbols of the checked object that nothing in the closure defines.
	for _, s := range root.undef {
		found := false
		for _, o := range order {
			vs, ok := o.defined[s.Name]
			if !ok {
				continue
			}
			if !s.HasVersion || s.Version == "" || vs[s.Version] || vs[""] {
				found = true
				break
			}
		}
		if !found {
			r.Undefined = append(r.Undefined, UndefinedSymbol{Name: s.Name, Version: s.Version, RequiredBy: root.path})
		}
	}
	sort.Slice(r.Undefined, func(i, j int) bool { return r.Undefined[i].Name < r.Undefined[j].Name })
	return r, nil
}

func hasMissing(ms []MissingLib, name string) bool {
	for _, m := range ms {
		if m.Name == name {
			return true
		}
	}
	return false
}

func readObject(path string) (o *object, err error) {
	// debug/elf reads untrusted bytes; a malformed file must be an error here, never a crash of the caller.
	defer func() {
		if r := recover(); r != nil {
			o, err = nil, fmt.Errorf("%w: %s: malformed (%v)", ErrNotELF, path, r)
		}
	}()
	f, err := elf.Open(path)
	if err != nil {
		var fe *elf.FormatError
		if errors.As(err, &fe) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return nil, fmt.Errorf("%w: %s: %v", ErrNotELF, path, err)
		}
		return nil, err
	}
	defer f.Close()
	o = &object{path: path, class: f.Class, machine: f.Machine, versions: map[string]bool{}, defined: map[string]map[string]bool{}}
	o.needed, _ = f.DynString(elf.DT_NEEDED)
	origin := filepath.Dir(path)
	if rp, _ := f.DynString(elf.DT_RPATH); len(rp) > 0 {
		o.rpath = expandDirs(rp, origin, f.Class)
	}
	if rp, _ := f.DynString(elf.DT_RUNPATH); len(rp) > 0 {
		o.runpath = expandDirs(rp, origin, f.Class)
	}
	if sn, _ := f.DynString(elf.DT_SONAME); len(sn) > 0 {
		o.soname = sn[0]
	}
	o.verneed, _ = f.DynamicVersionNeeds()
	if defs, err := f.DynamicVersions(); err == nil {
		for _, d := range defs {
			if d.Flags&elf.VER_FLG_BASE == 0 {
				o.versions[d.Name] = true
			}
		}
	}
	syms, _ := f.DynamicSymbols()
	for _, s := range syms {
		if s.Name == "" {
			continue
		}
		bind := elf.ST_BIND(s.Info)
		if s.Section == elf.SHN_UNDEF {
			if bind != elf.STB_WEAK {
				o.undef = append(o.undef, s)
			}
			continue
		}
		if bind != elf.STB_GLOBAL && bind != elf.STB_WEAK && bind != elf.STB_LOOS /* STB_GNU_UNIQUE */ {
			continue
		}
		m := o.defined[s.Name]
		if m == nil {
			m = map[string]bool{}
			o.defined[s.Name] = m
		}
		m[s.Version] = true
	}
	return o, nil
}

func expandDirs(entries []string, origin string, class elf.Class) []string {
	lib := "lib64"
	if class == elf.ELFCLASS32 {
		lib = "lib"
	}
	var out []string
	for _, e := range entries {
		for _, d := range strings.Split(e, ":") {
			if d == "" {
				continue
			}
			r := strings.NewReplacer("${ORIGIN}", origin, "$ORIGIN", origin, "${LIB}", lib, "$LIB", lib,
				"${PLATFORM}", "x86_64", "$PLATFORM", "x86_64")
			out = append(out, filepath.Clean(r.Replace(d)))
		}
	}
	return out
}

func splitPath(s string) []string {
	var out []string
	for _, d := range strings.FieldsFunc(s, func(r rune) bool { return r == ':' || r == ';' }) {
		if d != "" {
			out = append(out, d)
		}
	}
	return out
}

// resolve finds name for requester o the way glibc's loader does, returning the path and the folders tried.
func resolve(name string, o *object, ldPath, sys []string, loaded map[string]string) (string, []string) {
	if strings.Contains(name, "/") {
		if compatible(name, o) {
			return name, nil
		}
		return "", []string{name}
	}
	var dirs []string
	if len(o.runpath) == 0 {
		dirs = append(dirs, o.rpath...)
	}
	dirs = append(dirs, ldPath...)
	dirs = append(dirs, o.runpath...)
	var searched []string
	for _, d := range dirs {
		searched = append(searched, d)
		if p := filepath.Join(d, name); compatible(p, o) {
			return p, searched
		}
	}
	if p, ok := loaded[name]; ok && compatible(p, o) {
		return p, searched
	}
	for _, d := range sys {
		searched = append(searched, d)
		if p := filepath.Join(d, name); compatible(p, o) {
			return p, searched
		}
	}
	return "", searched
}

// compatible reports whether p is a readable ELF object of o's class and machine (the loader skips others).
func compatible(p string, o *object) bool {
	f, err := elf.Open(p)
	if err != nil {
		return false
	}
	defer f.Close()
	return f.Class == o.class && f.Machine == o.machine
}

func sortedVersions(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for v := range m {
		out = append(out, v)
	}
	sort.Slice(out, func(i, j int) bool { return versionLess(out[i], out[j]) })
	return out
}

// versionLess orders "FABRIC_1.9" before "FABRIC_1.10": numeric runs compare as numbers.
func versionLess(a, b string) bool {
	for a != "" && b != "" {
		da, db := isDigit(a[0]), isDigit(b[0])
		if da && db {
			na, ra := leadingNumber(a)
			nb, rb := leadingNumber(b)
			if na != nb {
				return na < nb
			}
			a, b = ra, rb
			continue
		}
		if a[0] != b[0] {
			return a[0] < b[0]
		}
		a, b = a[1:], b[1:]
	}
	return len(a) < len(b)
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

func leadingNumber(s string) (uint64, string) {
	var n uint64
	i := 0
	for i < len(s) && isDigit(s[i]) && i < 18 {
		n = n*10 + uint64(s[i]-'0')
		i++
	}
	return n, s[i:]
}

// loadedLibraries maps the file names and sonames of the shared objects mapped into this process to their
// paths: the loader satisfies a DT_NEEDED from those before it searches the system folders.
func loadedLibraries() map[string]string {
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		return nil
	}
	defer f.Close()
	out := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 6 || !strings.HasPrefix(fields[5], "/") || !strings.Contains(fields[5], ".so") {
			continue
		}
		p := fields[5]
		if _, ok := out[filepath.Base(p)]; ok {
			continue
		}
		out[filepath.Base(p)] = p
		if ef, err := elf.Open(p); err == nil {
			if sn, _ := ef.DynString(elf.DT_SONAME); len(sn) > 0 {
				if _, ok := out[sn[0]]; !ok {
					out[sn[0]] = p
				}
			}
			ef.Close()
		}
	}
	return out
}

// systemDirs returns the folders of /etc/ld.so.conf (with its includes) followed by the loader's defaults.
func systemDirs() []string {
	var dirs []string
	seen := map[string]bool{}
	add := func(d string) {
		d = filepath.Clean(d)
		if !seen[d] {
			seen[d] = true
			dirs = append(dirs, d)
		}
	}
	var readConf func(path string, depth int)
	readConf = func(path string, depth int) {
		if depth > 8 {
			return
		}
		f, err := os.Open(path)
		if err != nil {
			return
		}
		defer f.Close()
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			line := strings.TrimSpace(sc.Text())
			if i := strings.IndexByte(line, '#'); i >= 0 {
				line = strings.TrimSpace(line[:i])
			}
			if line == "" {
				continue
			}
			if rest, ok := strings.CutPrefix(line, "include "); ok {
				pat := strings.TrimSpace(rest)
				if !filepath.IsAbs(pat) {
					pat = filepath.Join(filepath.Dir(path), pat)
				}
				matches, _ := filepath.Glob(pat)
				sort.Strings(matches)
				for _, m := range matches {
					readConf(m, depth+1)
				}
				continue
			}
			if strings.HasPrefix(line, "/") {
				add(line)
			}
		}
	}
	readConf("/etc/ld.so.conf", 0)
	for _, d := range []string{"/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64", "/lib", "/usr/lib"} {
		add(d)
	}
	return dirs
}
