// Package nativetest checks a native-library package's table of status codes (internal/native.Table) the
// same way in nixl, cuda and neuron: every row's error matches its own sentinel and no other, every
// sentinel of the package has a row, and the messages name the operation, the code and the hint.
package nativetest

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gonixl/gonixl/internal/native"
)

// CheckTable checks tab against sentinels, the package's status sentinels (each must be the sentinel of
// at least one row), and unknown, a code missing from the table (it must match tab.Default, or itself).
func CheckTable[C native.Code](t *testing.T, tab *native.Table[C], sentinels []error, unknown C) {
	t.Helper()
	used := map[error]bool{}
	for _, c := range tab.Codes() {
		row := tab.Rows[c]
		require.NotEmpty(t, row.Name, "code %d", c)
		if row.Sentinel == nil {
			continue // a success code
		}
		used[row.Sentinel] = true
		t.Run(row.Name, func(t *testing.T) {
			err := fmt.Errorf("wrapped: %w", tab.Failed("some_call", c, "what was asked"))
			require.ErrorIs(t, err, row.Sentinel)
			for _, s := range sentinels {
				if s != row.Sentinel {
					require.NotErrorIs(t, err, s)
				}
			}
			var e *native.Error[C]
			require.ErrorAs(t, err, &e)
			assert.Equal(t, c, e.Code)
			assert.True(t, e.Native)
			msg := e.Error()
			want := []string{tab.Prefix + ": some_call: what was asked: ", row.Name, fmt.Sprintf("(%d)", int64(c)), row.Hint}
			for _, part := range want {
				assert.Contains(t, msg, part)
			}
		})
	}
	for _, s := range sentinels {
		assert.True(t, used[s], "sentinel %q has no row in the table", s)
		e := tab.Refused("some_call", s, "refused here")
		require.ErrorIs(t, e, s)
		assert.False(t, e.Native)
		assert.Empty(t, e.Hint, "a refusal's detail says what to do")
		assert.Equal(t, s, tab.Sentinel(e.Code), "a refusal carries a code of its sentinel")
		assert.Contains(t, e.Error(), tab.Prefix+": some_call: refused here: "+strings.TrimPrefix(s.Error(), tab.Prefix+": "))
	}

	_, known := tab.Rows[unknown]
	require.False(t, known, "code %d is in the table", unknown)
	e := tab.Failed("some_call", unknown, "")
	assert.Contains(t, e.Error(), fmt.Sprintf("(%d)", int64(unknown)))
	if tab.Default != nil {
		require.ErrorIs(t, e, tab.Default)
	} else if self, ok := any(unknown).(error); ok {
		require.ErrorIs(t, e, self)
	}
	for _, s := range sentinels {
		if s != tab.Default {
			require.False(t, errors.Is(e, s), "unknown code %d matches %q", unknown, s)
		}
	}
}

// Refusal is one call a package refuses on the Go side, for CheckRefusals.
type Refusal struct {
	Name      string  // the subtest's name
	Err       error   // what the call returned
	Op        string  // the operation the error must name
	Sentinels []error // what errors.Is must match: the package's sentinel, and any cause (a layout or context error)
}

// CheckRefusals checks that each refusal is the package's *native.Error[C] (errors.As), refused on the Go
// side (Native false), matches its sentinels (errors.Is), and reads "prefix: op: …".
func CheckRefusals[C native.Code](t *testing.T, tab *native.Table[C], refusals []Refusal) {
	t.Helper()
	for _, r := range refusals {
		t.Run(r.Name, func(t *testing.T) {
			require.Error(t, r.Err)
			var e *native.Error[C]
			require.ErrorAs(t, r.Err, &e)
			assert.False(t, e.Native, "refused on the Go side")
			assert.Equal(t, r.Op, e.Op)
			assert.NotEmpty(t, e.Detail, "the detail says what was wrong")
			for _, s := range r.Sentinels {
				require.ErrorIs(t, r.Err, s)
			}
			assert.True(t, strings.HasPrefix(e.Error(), tab.Prefix+": "+r.Op+": "), "%q names the package and the op", e.Error())
		})
	}
}
