package nixl_test

import (
	"encoding/binary"
	"errors"
	"testing"

	"github.com/gonixl/gonixl/internal/nixltest"
	"github.com/gonixl/gonixl/nixl"
)

func serdesBlob(name string, tail string) []byte {
	b := []byte("nixlSerDes|Agent")
	b = binary.LittleEndian.AppendUint64(b, uint64(len(name)))
	b = append(b, name...)
	return append(b, "|"+tail...)
}

func TestMetadataAgentName(t *testing.T) {
	if got, err := nixl.MetadataAgentName(serdesBlob("prefill-tp0", "Conns...")); err != nil || got != "prefill-tp0" {
		t.Fatalf("got %q, %v", got, err)
	}
	full := serdesBlob("a", "")
	for _, bad := range [][]byte{nil, []byte("nixlSerDes|"), []byte("garbage"), full[:len(full)-1], full[:20],
		append([]byte("nixlSerDes|Agent"), 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 'x', '|'),
		serdesBlob("", "")} {
		if _, err := nixl.MetadataAgentName(bad); !errors.Is(err, nixl.ErrInvalidParam) {
			t.Errorf("%q: got %v, want nixl.ErrInvalidParam", bad, err)
		}
	}
}

// A real agent's blob carries its name where MetadataAgentName reads it.
func TestMetadataAgentNameOfRealAgent(t *testing.T) {
	a := nixltest.Agent(t, "md-name-agent")
	md, err := a.LocalMetadata()
	if err != nil {
		t.Fatal(err)
	}
	if got, err := nixl.MetadataAgentName(md); err != nil || got != a.Name() {
		t.Fatalf("got %q, %v; want %q", got, err, a.Name())
	}
	if got, err := nixl.MetadataAgentName(md[:len(md)/2]); err != nil || got != a.Name() {
		t.Fatalf("half a blob still names the agent (what a hostile peer sends): got %q, %v", got, err)
	}
}

func FuzzMetadataAgentName(f *testing.F) {
	f.Add(serdesBlob("prefill-tp0", "Conns"))
	f.Add([]byte("nixlSerDes|Agent"))
	f.Fuzz(func(t *testing.T, b []byte) {
		name, err := nixl.MetadataAgentName(b)
		if err == nil && (name == "" || len(name) >= len(b)) {
			t.Fatalf("name %q from %d bytes", name, len(b))
		}
	})
}
