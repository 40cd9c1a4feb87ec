// Package descmerge reproduces how many descriptors NIXL posts for a transfer (NIXL ≥ 1.5 merges adjacent
// descriptors by default), so that gonixl's tests can state descriptor counts without running a transfer;
// nixl's tests check the rule against NIXL's own telemetry. It is test support: nothing in the public API
// needs it.
package descmerge

// desc is a descriptor as the rule sees it; layout.Desc and nixl.Desc have this shape.
type desc struct{ Addr, Len, DevID uint64 }

// Posted is the number of descriptors NIXL posts for a transfer of prepared lists local and remote with
// paired indices li and ri: a run of pairs whose indices are consecutive on both sides and whose descriptors
// are adjacent in memory (same device) on both sides becomes one descriptor. Indices must be in range.
func Posted[D ~struct{ Addr, Len, DevID uint64 }](local, remote []D, li, ri []int) int {
	n := 0
	for i := range li {
		if i > 0 && li[i] == li[i-1]+1 && ri[i] == ri[i-1]+1 &&
			adjacent(desc(local[li[i-1]]), desc(local[li[i]])) && adjacent(desc(remote[ri[i-1]]), desc(remote[ri[i]])) {
			continue
		}
		n++
	}
	return n
}

func adjacent(a, b desc) bool { return a.DevID == b.DevID && a.Addr+a.Len == b.Addr }
