package native

import (
	"errors"
	"fmt"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var (
	errA     = errors.New("lib: a failed")
	errB     = errors.New("lib: b failed")
	errOther = errors.New("lib: failure")
	errGo    = errors.New("lib: closed")
)

type status int32

// selfErr is a code type whose values are errors, like cuda.Result.
type selfErr int

func (s selfErr) Error() string { return "SELF(" + strconv.Itoa(int(s)) + ")" }

func table() *Table[status] {
	return &Table[status]{
		Prefix: "lib",
		Rows: map[status]Row{
			0:  {"LIB_OK", nil, ""},
			-3: {"LIB_B_AGAIN", errB, ""},
			-1: {"LIB_A", errA, "do a"},
			-2: {"LIB_B", errB, "do b"},
		},
		Unknown: "lib_status(%d)",
		Default: errOther,
	}
}

func TestTable(t *testing.T) {
	tab := table()
	cases := []struct {
		code     status
		name     string
		sentinel error
		hint     string
	}{
		{-1, "LIB_A", errA, "do a"},
		{-2, "LIB_B", errB, "do b"},
		{-3, "LIB_B_AGAIN", errB, ""},
		{-9, "lib_status(-9)", errOther, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := tab.Failed("op", c.code, "detail")
			var err error = fmt.Errorf("wrapped: %w", e)
			require.ErrorIs(t, err, c.sentinel)
			for _, other := range []error{errA, errB, errOther, errGo} {
				if other != c.sentinel {
					require.NotErrorIs(t, err, other)
				}
			}
			var got *Error[status]
			require.ErrorAs(t, err, &got)
			assert.Equal(t, c.code, got.Code)
			assert.Equal(t, c.name, got.Name)
			assert.Equal(t, c.hint, got.Hint)
			assert.True(t, got.Native)
			want := fmt.Sprintf("lib: op: detail: %s (%d)", c.name, c.code)
			if c.hint != "" {
				want += " — " + c.hint
			}
			assert.Equal(t, want, e.Error())
		})
	}
	assert.Equal(t, []status{-3, -2, -1, 0}, tab.Codes())
}

func TestRefused(t *testing.T) {
	tab := table()
	e := tab.Refused("op", errB, "too big")
	require.ErrorIs(t, e, errB)
	assert.False(t, e.Native)
	assert.Equal(t, status(-3), e.Code, "the lowest code with that sentinel")
	assert.Equal(t, "LIB_B_AGAIN", e.Name)
	assert.Equal(t, "lib: op: too big: b failed", e.Error(), "the sentinel, not a status the library never gave")

	e = tab.Refused("op", errA, "bad")
	assert.Equal(t, "lib: op: bad: a failed", e.Error(), "the detail says what to do, not the hint of the code")
	assert.Empty(t, e.Hint)

	e = tab.Refused("use", errGo, "")
	require.ErrorIs(t, e, errGo)
	assert.Equal(t, status(0), e.Code, "no code stands for errGo")
	assert.Empty(t, e.Name)
	assert.Equal(t, "lib: use: closed", e.Error())
}

func TestDescriptionAndRuntimeNames(t *testing.T) {
	tab := table()
	tab.Name = func(c status) string {
		if c == -9 {
			return "LIB_NEW_CODE"
		}
		return ""
	}
	tab.Describe = func(c status) string {
		if c == -1 {
			return "LIB_A" // a description that only repeats the name is left out
		}
		return "something broke"
	}
	assert.Equal(t, "LIB_NEW_CODE", tab.NameOf(-9), "the library's own name wins")
	assert.Equal(t, "LIB_A", tab.NameOf(-1), "else the table's")
	assert.Equal(t, "lib: op: LIB_NEW_CODE (-9): something broke", tab.Failed("op", -9, "").Error())
	assert.Equal(t, "lib: op: LIB_A (-1) — do a", tab.Failed("op", -1, "").Error())
}

func TestCodeIsItsOwnSentinel(t *testing.T) {
	tab := &Table[selfErr]{Prefix: "self", Rows: map[selfErr]Row{1: {"SELF_ONE", selfErr(1), "hint"}}, Unknown: "SELF(%d)"}
	require.ErrorIs(t, tab.Failed("op", 1, ""), selfErr(1))
	require.ErrorIs(t, tab.Failed("op", 77, ""), selfErr(77), "a code missing from the table is its own sentinel")
	require.NotErrorIs(t, tab.Failed("op", 77, ""), selfErr(1))
	e := tab.Refused("op", selfErr(1), "bad")
	assert.Equal(t, selfErr(1), e.Code)
	assert.Equal(t, "self: op: bad: SELF(1)", e.Error())

	plain := &Table[status]{Prefix: "p"}
	assert.NoError(t, plain.Sentinel(5), "no default and a code that is no error: no sentinel")
	assert.Equal(t, "p: op: status 5 (5)", plain.Failed("op", 5, "").Error())
}

// errCause stands for another package's error (a layout sentinel) that a refusal wraps.
var errCause = errors.New("other: bad geometry")

func TestRefusefKeepsTheCause(t *testing.T) {
	tab := table()
	e := tab.Refusef("op", errA, "geometry %d: %w", 3, errCause)
	require.ErrorIs(t, e, errA)
	require.ErrorIs(t, e, errCause)
	require.NotErrorIs(t, e, errB)
	assert.Same(t, errCause, e.Cause)
	assert.False(t, e.Native)
	assert.Equal(t, "geometry 3: other: bad geometry", e.Detail)
	assert.Equal(t, "lib: op: geometry 3: other: bad geometry: a failed", e.Error())
	var got *Error[status]
	require.ErrorAs(t, fmt.Errorf("outer: %w", e), &got)
	assert.Same(t, e, got)

	two := tab.Refusef("op", nil, "%w and %w", errCause, errGo)
	require.ErrorIs(t, two, errCause)
	require.ErrorIs(t, two, errGo)
	assert.Equal(t, "lib: op: other: bad geometry and lib: closed", two.Error(), "no sentinel: the detail alone")

	plain := tab.Refusef("op", errB, "size %d", 7)
	assert.NoError(t, plain.Cause, "no %w: no cause")
	assert.Equal(t, tab.Refused("op", errB, "size 7"), plain)
}
