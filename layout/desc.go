package layout

// Desc is one NIXL transfer descriptor: a byte range on a device. It has exactly the field set of
// nixl.Desc, so callers convert with nixl.Desc(d) (this package imports nothing of gonixl's).
type Desc struct {
	Addr, Len, DevID uint64
}
