package nixl

import (
	"bytes"
	"encoding/binary"
)

// NIXL's metadata blob (LocalMetadata) is a nixlSerDes string: the header "nixlSerDes|", then entries
// <tag><8-byte little-endian length><value>"|"; its first entry is the agent's name under the tag "Agent".
const (
	serdesHeader = "nixlSerDes|"
	serdesName   = "Agent"
)

// MetadataAgentName reads the agent name a metadata blob (another agent's LocalMetadata) carries, without
// loading it: a caller can refuse a blob whose name would collide with an agent it already loaded before
// NIXL merges the two (NIXL keys remote agents by the name the blob claims). It parses only the header and
// the first entry; the rest of the blob is NIXL's to check when it is loaded.
func MetadataAgentName(md []byte) (string, error) {
	rest, ok := bytes.CutPrefix(md, []byte(serdesHeader+serdesName))
	if !ok {
		return "", goErr("read metadata agent name", ErrInvalidParam, "%d-byte blob does not start with %q: not NIXL agent metadata", len(md), serdesHeader+serdesName)
	}
	if len(rest) < 8 {
		return "", goErr("read metadata agent name", ErrInvalidParam, "blob truncated in the agent name's length")
	}
	n := binary.LittleEndian.Uint64(rest)
	rest = rest[8:]
	if n == 0 || n >= uint64(len(rest)) || rest[n] != '|' {
		return "", goErr("read metadata agent name", ErrInvalidParam, "agent name of %d bytes does not fit the %d bytes left, or is not followed by '|'", n, len(rest))
	}
	return string(rest[:n]), nil
}
