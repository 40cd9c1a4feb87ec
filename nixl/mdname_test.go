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

func TestRenameMetadata(t *testing.T) {
	md := serdesBlob("prefill-tp0", "Conns...")
	got, err := nixl.RenameMetadata(md, "prefill-tp0#7")
	if err != nil {
		t.Fatal(err)
	}
	if want := serdesBlob("prefill-tp0#7", "Conns..."); string(got) != string(want) {
		t.Fatalf("got %q, want %q", got, want)
	}
	if string(md) != string(serdesBlob("prefill-tp0", "Conns...")) {
		t.Fatal("the blob given was changed")
	}
	if _, err := nixl.RenameMetadata(md, ""); !errors.Is(err, nixl.ErrInvalidParam) {
		t.Errorf("empty name: got %v, want nixl.ErrInvalidParam", err)
	}
	if _, err := nixl.RenameMetadata([]byte("garbage"), "x"); !errors.Is(err, nixl.ErrInvalidParam) {
		t.Errorf("not a blob: got %v, want nixl.ErrInvalidParam", err)
	}
}

// A real agent's blob, renamed, loads under the new name, and the agent under it reads the peer's memory.
func TestRenameMetadataOfRealAgent(t *testing.T) {
	a := nixltest.Agent(t, "md-rename-a")
	b := nixltest.Agent(t, "md-rename-b")
	md, err := a.LocalMetadata()
	if err != nil {
		t.Fatal(err)
	}
	renamed, err := nixl.RenameMetadata(md, "md-rename-a#1")
	if err != nil {
		t.Fatal(err)
	}
	if got, err := b.LoadRemoteMetadata(renamed); err != nil || got != "md-rename-a#1" {
		t.Fatalf("got %q, %v", got, err)
	}
	if got, err := b.LoadRemoteMetadata(md); err != nil || got != a.Name() {
		t.Fatalf("the original name loads beside it: got %q, %v", got, err)
	}
}

func FuzzRenameMetadata(f *testing.F) {
	f.Add(serdesBlob("prefill-tp0", "Conns"), "x")
	f.Add([]byte("nixlSerDes|Agent"), "")
	f.Fuzz(func(t *testing.T, b []byte, name string) {
		out, err := nixl.RenameMetadata(b, name)
		if err != nil {
			return
		}
		if got, err := nixl.MetadataAgentName(out); err != nil || got != name {
			t.Fatalf("renamed to %q, reads %q, %v", name, got, err)
		}
	})
}
