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

// RenameMetadata returns a copy of a metadata blob (another agent's LocalMetadata) whose agent name is name:
// loaded, the agent is known under name instead of the one it claims (which MetadataAgentName reads). Only
// the name entry changes; the rest of the blob is NIXL's to check when it is loaded. A caller that loads
// every blob under a name of its own never reuses a name NIXL might still hold part of a failed load under
// (see Agent.LoadRemoteMetadata); transfers and notifications to the agent then name it so, and the peer
// sees nothing of it.
func RenameMetadata(md []byte, name string) ([]byte, error) {
	old, err := MetadataAgentName(md)
	if err != nil {
		return nil, err
	}
	if name == "" {
		return nil, goErr("rename metadata", ErrInvalidParam, "empty agent name: set the name to load the agent under")
	}
	rest := md[len(serdesHeader)+len(serdesName)+8+len(old):]
	out := make([]byte, 0, len(md)-len(old)+len(name))
	out = append(out, serdesHeader+serdesName...)
	out = binary.LittleEndian.AppendUint64(out, uint64(len(name)))
	out = append(out, name...)
	return append(out, rest...), nil
}
