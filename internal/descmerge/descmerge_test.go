package descmerge

import (
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestPosted(t *testing.T) {
	d := func(addrs ...uint64) []desc {
		out := make([]desc, len(addrs))
		for i, a := range addrs {
			out[i] = desc{Addr: a, Len: 10}
		}
		return out
	}
	l := d(0, 10, 20, 40, 50)
	r := d(100, 110, 120, 130, 140)
	require.Equal(t, 1, Posted(l, r, []int{0, 1, 2}, []int{0, 1, 2}))
	require.Equal(t, 2, Posted(l, r, []int{2, 3, 4}, []int{2, 3, 4}), "local gap between 2 and 3")
	require.Equal(t, 2, Posted(l, r, []int{0, 1}, []int{1, 0}))
	require.Equal(t, 3, Posted(l, r, []int{0, 2, 1}, []int{0, 2, 1}), "indices not consecutive")
	require.Equal(t, 0, Posted(l, r, nil, nil))
	r[1].DevID = 1
	require.Equal(t, 3, Posted(l, r, []int{0, 1, 2}, []int{0, 1, 2}), "other device")
}
