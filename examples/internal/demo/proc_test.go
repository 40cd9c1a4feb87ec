package demo

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A child whose stdout has a line longer than the reader's buffer, followed by more than a pipe holds, still
// runs to its end: StartProc keeps draining stdout after its line reader gives up.
func TestStartProcDrainsLongLines(t *testing.T) {
	script := `head -c 200000 /dev/zero | tr '\0' x; echo; head -c 1000000 /dev/zero | tr '\0' y; echo; echo done`
	p, err := StartProc("long-lines", filepath.Join(t.TempDir(), "child.log"), nil, "sh", "-c", script)
	require.NoError(t, err)
	select {
	case <-p.Done():
	case <-time.After(20 * time.Second):
		p.Stop(time.Second)
		t.Fatal("the child blocked writing to its stdout pipe")
	}
	require.NoError(t, p.Err())
}
