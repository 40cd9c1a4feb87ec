//go:build linux

package netns

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

// kernelMessage is one netlink message as the kernel sends it to a queue's socket.
func kernelMessage(typ uint16, body []byte) []byte {
	b := binary.NativeEndian.AppendUint32(nil, uint32(16+len(body)))
	b = binary.NativeEndian.AppendUint16(b, typ)
	b = binary.NativeEndian.AppendUint16(b, 0)
	b = binary.NativeEndian.AppendUint32(b, 0)
	b = binary.NativeEndian.AppendUint32(b, 0)
	b = append(b, body...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

// packetMessage is NFQNL_MSG_PACKET for packet id: nfgenmsg, NFQA_PACKET_HDR (id, ETH_P_IP, NF_INET_LOCAL_OUT),
// NFQA_IFINDEX_OUTDEV.
func packetMessage(id uint32) []byte {
	body := []byte{syscall.AF_INET, 0, 0, 0}
	hdr := binary.BigEndian.AppendUint32(nil, id)
	hdr = binary.BigEndian.AppendUint16(hdr, 0x0800)
	hdr = append(hdr, 3)
	body = attr(body, nfqaPacketHdr, hdr)
	body = attr(body, 5, binary.BigEndian.AppendUint32(nil, 2))
	return kernelMessage(nfnlSubsysQueue<<8|nfqnlMsgPacket, body)
}

// The fuzz corpus in testdata/ (read as seeds) decodes as this test says: two packets in one read, a refused
// verdict, a packet message without its header.
func TestQueueMessages(t *testing.T) {
	seeds := map[string][]byte{}
	dir := filepath.Join("testdata", "fuzz", "FuzzQueueMessages")
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	for _, e := range entries {
		raw, err := os.ReadFile(filepath.Join(dir, e.Name()))
		require.NoError(t, err)
		lines := strings.SplitN(string(raw), "\n", 2)
		require.Equal(t, "go test fuzz v1", lines[0])
		s, err := strconv.Unquote(strings.TrimSuffix(strings.TrimSpace(strings.TrimPrefix(lines[1], "[]byte(")), ")"))
		require.NoError(t, err, e.Name())
		seeds[e.Name()] = []byte(s)
	}
	require.Equal(t, append(packetMessage(7), packetMessage(8)...), seeds["two-packets"], "the seed is what the kernel sends")
	ids, err := queueMessages(seeds["two-packets"])
	require.NoError(t, err)
	require.Equal(t, []uint32{7, 8}, ids)

	ids, err = queueMessages(seeds["refused-verdict"])
	require.ErrorIs(t, err, syscall.ENOENT)
	require.Empty(t, ids)

	ids, err = queueMessages(seeds["no-packet-header"])
	require.ErrorContains(t, err, "no packet header")
	require.Empty(t, ids)
}

// FuzzQueueMessages: whatever a read returns, decoding it does not panic and yields at most one id per message.
func FuzzQueueMessages(f *testing.F) {
	f.Add(packetMessage(1))
	f.Fuzz(func(t *testing.T, b []byte) {
		ids, _ := queueMessages(b)
		require.LessOrEqual(t, len(ids), len(b)/20)
	})
}
